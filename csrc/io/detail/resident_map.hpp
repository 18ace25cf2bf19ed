// Serving reads from the page cache when it already holds them. O_DIRECT
// always goes to the device, so a data set that fits in memory and was read
// before would gain nothing from being there; a read-only mapping of the file
// plus mincore() tells, without touching the device, whether every page of a
// window is resident, and a copy from the mapping then costs no IO at all.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pod_init {

class ResidentMap {
 public:
  ResidentMap() = default;
  ~ResidentMap();
  ResidentMap(ResidentMap&& other) noexcept;
  ResidentMap& operator=(ResidentMap&& other) noexcept;
  ResidentMap(const ResidentMap&) = delete;
  ResidentMap& operator=(const ResidentMap&) = delete;

  // Maps the first `size` bytes of fd read-only. Returns 0 or -errno.
  int map(int fd, uint64_t size);
  void unmap();

  // Copies [offset, offset + length) to dst when it lies in the mapping and
  // every page of it is in the page cache; returns false (nothing copied)
  // otherwise. mincore() reports the page cache only to the file's owner or a
  // writer (Linux 5.2 and later); for others it sees just the pages this
  // process has touched, and the rest are read directly: slower, still right.
  bool copy_if_resident(uint64_t offset, size_t length, uint8_t* dst) const;

 private:
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace pod_init
