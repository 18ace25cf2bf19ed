#include "io/latency_histogram.hpp"

#include <algorithm>
#include <cstdint>

namespace pod_init {

// Values below kSubBuckets get a bucket each; above, the top four bits of the
// value (leading one plus three) pick the bucket within its octave.
int LatencyHistogram::bucket_of(uint64_t ns) {
  if (ns < kSubBuckets) return static_cast<int>(ns);
  int octave = 63 - __builtin_clzll(ns);  // >= 3
  int sub = static_cast<int>((ns >> (octave - 3)) & (kSubBuckets - 1));
  int bucket = (octave - 2) * kSubBuckets + sub;
  return std::min(bucket, kBuckets - 1);
}

uint64_t LatencyHistogram::bucket_floor_ns(int bucket) {
  if (bucket < kSubBuckets) return static_cast<uint64_t>(bucket);
  int octave = bucket / kSubBuckets + 2;
  uint64_t sub = static_cast<uint64_t>(bucket % kSubBuckets);
  return (uint64_t{1} << octave) + (sub << (octave - 3));
}

void LatencyHistogram::record(uint64_t ns) {
  ++buckets_[static_cast<size_t>(bucket_of(ns))];
  ++count_;
  max_ = std::max(max_, ns);
}

void LatencyHistogram::merge(const LatencyHistogram& other) {
  for (size_t i = 0; i < buckets_.size(); ++i) buckets_[i] += other.buckets_[i];
  count_ += other.count_;
  max_ = std::max(max_, other.max_);
}

uint64_t LatencyHistogram::percentile_ns(double q) const {
  if (count_ == 0) return 0;
  uint64_t rank = static_cast<uint64_t>(std::clamp(q, 0.0, 1.0) * static_cast<double>(count_ - 1));
  uint64_t seen = 0;
  for (int b = 0; b < kBuckets; ++b) {
    seen += buckets_[static_cast<size_t>(b)];
    if (seen > rank) {
      uint64_t low = bucket_floor_ns(b);
      uint64_t high = b + 1 < kBuckets ? bucket_floor_ns(b + 1) : max_ + 1;
      return std::min(low + (high - low) / 2, max_);
    }
  }
  return max_;
}

}  // namespace pod_init
