// Latencies in log-spaced buckets (8 per power of two, within about 9 %), so
// a reader or the monitor can keep millions of samples in 4 KiB and still
// answer p50, p99 and p99.9.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace pod_init {

class LatencyHistogram {
 public:
  static constexpr int kSubBuckets = 8;
  static constexpr int kOctaves = 48;  // up to about 78 hours in nanoseconds

  void record(uint64_t nanoseconds);
  void merge(const LatencyHistogram& other);
  uint64_t count() const { return count_; }
  uint64_t max_ns() const { return max_; }
  // The value below which a fraction `q` (0..1) of the samples lie: the
  // middle of the bucket holding that rank, clamped to the largest sample.
  uint64_t percentile_ns(double q) const;
  // Bucket lower bounds and counts, for exporting (empty buckets skipped by callers).
  static uint64_t bucket_floor_ns(int bucket);
  uint64_t bucket_count(int bucket) const { return buckets_[static_cast<size_t>(bucket)]; }
  static constexpr int kBuckets = kOctaves * kSubBuckets;

 private:
  static int bucket_of(uint64_t nanoseconds);
  std::array<uint64_t, kBuckets> buckets_{};
  uint64_t count_ = 0;
  uint64_t max_ = 0;
};

}  // namespace pod_init
