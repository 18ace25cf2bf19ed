#include "io/detail/resident_map.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

namespace pod_init {

namespace {

uint64_t page_size() {
  static const uint64_t size = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return size;
}

}  // namespace

ResidentMap::~ResidentMap() { unmap(); }

ResidentMap::ResidentMap(ResidentMap&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)), size_(std::exchange(other.size_, 0)) {}

ResidentMap& ResidentMap::operator=(ResidentMap&& other) noexcept {
  if (this != &other) {
    unmap();
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

int ResidentMap::map(int fd, uint64_t size) {
  unmap();
  if (size == 0) return 0;
  void* base = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return -errno;
  // Should a page be evicted between mincore() and the copy, fault in that
  // page alone rather than the read-around the kernel would otherwise add.
  madvise(base, size, MADV_RANDOM);
  base_ = static_cast<uint8_t*>(base);
  size_ = size;
  return 0;
}

void ResidentMap::unmap() {
  if (base_ != nullptr) munmap(base_, size_);
  base_ = nullptr;
  size_ = 0;
}

bool ResidentMap::copy_if_resident(uint64_t offset, size_t length, uint8_t* dst) const {
  if (base_ == nullptr || offset > size_ || length > size_ - offset) return false;
  if (length == 0) return true;
  const uint64_t page = page_size();
  const uint64_t first = offset / page * page;
  const uint64_t pages = (offset + length - first + page - 1) / page;
  unsigned char small[64];
  std::vector<unsigned char> large;
  unsigned char* resident = small;
  if (pages > sizeof small) {
    large.resize(pages);
    resident = large.data();
  }
  if (mincore(base_ + first, pages * page, resident) != 0) return false;
  for (uint64_t i = 0; i < pages; ++i) {
    if ((resident[i] & 1) == 0) return false;
  }
  std::memcpy(dst, base_ + offset, length);
  return true;
}

}  // namespace pod_init
