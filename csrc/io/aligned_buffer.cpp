#include "io/aligned_buffer.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <utility>

namespace pod_init {

AlignedBuffer::AlignedBuffer(size_t size) : size_(size) {
  void* p = nullptr;
  // posix_memalign(0) may return nullptr; a zero-length buffer still needs an address.
  if (posix_memalign(&p, kPageSize, size == 0 ? kPageSize : size) == 0) {
    data_ = static_cast<uint8_t*>(p);
  } else {
    size_ = 0;
  }
}

AlignedBuffer::~AlignedBuffer() { free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

uint8_t* AlignedBuffer::release() {
  size_ = 0;
  return std::exchange(data_, nullptr);
}

BufferPool::~BufferPool() {
  if (base_ != nullptr) munmap(base_, bytes());
}

int BufferPool::init(size_t slot_size, size_t count) {
  size_t total = slot_size * count;
  void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return -errno;
  if (madvise(p, total, MADV_DONTFORK) < 0) {
    int err = errno;
    munmap(p, total);
    return -err;
  }
  base_ = static_cast<uint8_t*>(p);
  slot_size_ = slot_size;
  count_ = count;
  free_.reserve(count);
  for (size_t i = count; i-- > 0;) free_.push_back(base_ + i * slot_size);
  return 0;
}

bool BufferPool::contains(const void* p) const {
  auto* byte = static_cast<const uint8_t*>(p);
  return base_ != nullptr && byte >= base_ && byte < base_ + bytes();
}

uint8_t* BufferPool::acquire() {
  if (free_.empty()) return nullptr;
  uint8_t* slot = free_.back();
  free_.pop_back();
  return slot;
}

void BufferPool::release(uint8_t* slot) { free_.push_back(slot); }

void BufferPool::abandon() {
  base_ = nullptr;
  count_ = 0;
  free_.clear();
}

}  // namespace pod_init
