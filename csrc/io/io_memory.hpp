// Memory the reader owns and hands out: page-aligned blocks that arrays
// returned by read(), read_batch() and aligned_empty() live in, and that
// streams and writers stage IO in. Blocks up to 4 MiB come from per-size
// arenas that are mapped once, faulted in at mapping and kept for reuse, so a
// read costs no mmap and no page faults; larger ones get a mapping each,
// unmapped when they are released.
//
// Every arena and large mapping is a region with an id that is never reused.
// A ring registers regions as fixed buffers by id, not by address: when a
// large block is unmapped its id is retired (and rings drop their
// registration of it on their next call), so memory mapped later at the same
// address is a new region and can never be reached through the old pinning.
// Arenas are never unmapped, so their registrations stay right for the life
// of the process. The pool is shared by a forked child (not MADV_DONTFORK:
// arrays made before a DataLoader forks must stay readable there).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace pod_init {

struct IoBlock {
  uint8_t* data = nullptr;  // nullptr: no memory (allocation failed, or a moved-from block)
  size_t size = 0;          // usable bytes, at least what was asked for
  uint64_t region = 0;      // the region it lies in
  int size_class = -1;      // -1: a mapping of its own
};

struct IoRegion {
  uint64_t id = 0;
  uint8_t* base = nullptr;
  size_t bytes = 0;
  bool arena = false;  // kept for the life of the process
};

struct IoMemoryStats {
  uint64_t arena_bytes = 0;    // mapped for arenas (kept)
  uint64_t large_bytes = 0;    // mapped for blocks of their own (in use)
  uint64_t blocks_in_use = 0;  // handed out and not yet released
  uint64_t regions_retired = 0;
};

class IoMemory {
 public:
  static constexpr size_t kSmallest = 4096;
  static constexpr int kClasses = 11;  // 4 KiB .. 4 MiB
  static constexpr size_t kLargest = kSmallest << (kClasses - 1);
  // Beyond this much arena memory, blocks get mappings of their own (and go
  // back to the kernel when released) instead of growing the pool further.
  static constexpr size_t kArenaLimit = size_t{512} << 20;

  // The process's pool (never destroyed: arrays may outlive static destructors).
  static IoMemory& instance();

  // A block of at least `size` bytes (a page when size is 0); data is nullptr
  // when the memory cannot be had.
  IoBlock acquire(size_t size);
  void release(const IoBlock& block);

  // The live region holding [p, p + bytes), if any.
  bool find(const void* p, size_t bytes, IoRegion* region) const;
  bool live(uint64_t region) const;
  // Counts retirements; a ring compares it with what it saw last.
  uint64_t retired_count() const { return retired_count_.load(std::memory_order_acquire); }
  // The ids retired after the first `seen` retirements; false when some of
  // them are no longer remembered (then check every registration with live()).
  bool retired_since(uint64_t seen, std::vector<uint64_t>* ids) const;
  IoMemoryStats stats() const;

 private:
  IoMemory() = default;
  std::atomic<uint64_t> retired_count_{0};
};

// A block that goes back to the pool when it dies.
class OwnedBlock {
 public:
  OwnedBlock() = default;
  explicit OwnedBlock(size_t size) : block_(IoMemory::instance().acquire(size)) {}
  ~OwnedBlock() { reset(); }
  OwnedBlock(OwnedBlock&& other) noexcept : block_(other.take()) {}
  OwnedBlock& operator=(OwnedBlock&& other) noexcept {
    if (this != &other) {
      reset();
      block_ = other.take();
    }
    return *this;
  }
  OwnedBlock(const OwnedBlock&) = delete;
  OwnedBlock& operator=(const OwnedBlock&) = delete;

  uint8_t* data() const { return block_.data; }
  size_t size() const { return block_.size; }
  // Hands the block to a new owner, who releases it to IoMemory::instance().
  IoBlock take() {
    IoBlock block = block_;
    block_ = {};
    return block;
  }
  void reset() {
    if (block_.data != nullptr) IoMemory::instance().release(take());
  }

 private:
  IoBlock block_;
};

}  // namespace pod_init
