// Memory for O_DIRECT: page-aligned allocations that callers may own, and a
// per-process pool of bounce slots that is never shared with a forked child
// (MADV_DONTFORK), so a fork while reads are in flight cannot redirect them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pod_init {

inline constexpr size_t kPageSize = 4096;

inline uint64_t align_down(uint64_t value, uint64_t alignment) {
  return value / alignment * alignment;
}
inline uint64_t align_up(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// An owning, page-aligned allocation (freed with free()); released to a caller
// that takes over ownership, e.g. a numpy array's base object.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // data() is nullptr when the allocation fails.
  explicit AlignedBuffer(size_t size);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  uint8_t* release();  // the caller frees it with free()

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// `count` slots of `slot_size` bytes in one mapping, so io_uring can register
// it as a single fixed buffer.
class BufferPool {
 public:
  BufferPool() = default;
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // Returns 0 or -errno.
  int init(size_t slot_size, size_t count);
  uint8_t* base() const { return base_; }
  size_t bytes() const { return slot_size_ * count_; }
  size_t slot_size() const { return slot_size_; }
  bool contains(const void* p) const;
  // nullptr when every slot is taken.
  uint8_t* acquire();
  void release(uint8_t* slot);
  // For a forked child: forget the mapping without unmapping (the child never had it).
  void abandon();

 private:
  uint8_t* base_ = nullptr;
  size_t slot_size_ = 0;
  size_t count_ = 0;
  std::vector<uint8_t*> free_;
};

}  // namespace pod_init
