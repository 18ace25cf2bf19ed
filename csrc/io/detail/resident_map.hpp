// Serving reads from the page cache when it already holds them. O_DIRECT
// always goes to the device, so a data set that fits in memory and was read
// before would gain nothing from being there; a read-only mapping of the file
// plus mincore() tells, without touching the device, whether every page of a
// window is resident, and a buffered pread() of the file then copies it from
// the cache at no IO. The copy is a pread, never a load from the mapping: a
// file that shrinks under a mapping turns the load into SIGBUS, a pread into
// a short read, which the direct path reports as ENODATA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pod_init {

class ResidentMap {
 public:
  ResidentMap() = default;
  ~ResidentMap();
  ResidentMap(ResidentMap&& other) noexcept;
  ResidentMap& operator=(ResidentMap&& other) noexcept;
  ResidentMap(const ResidentMap&) = delete;
  ResidentMap& operator=(const ResidentMap&) = delete;

  // Maps the first `size` bytes of `direct_fd` read-only (for mincore) and
  // opens `path` again without O_DIRECT (for the copies), refusing a path
  // that names another file by now. Returns 0 or -errno (-ESTALE: replaced).
  int open(const std::string& path, int direct_fd, uint64_t size);
  // The same file, with descriptors and a mapping of its own (a stream may
  // outlive the reader it came from). Returns 0 or -errno.
  int open_like(const ResidentMap& other);
  void close();

  // Copies [offset, offset + length) to dst when it lies in the mapping,
  // every page of it is in the page cache, and the file still holds it;
  // returns false otherwise (dst may then hold part of it: the caller reads
  // the rows again). mincore() reports the page cache only to the file's
  // owner or a writer (Linux 5.2 and later); for others it sees just the pages
  // this process has touched, and the rest are read directly: slower, still right.
  bool copy_if_resident(uint64_t offset, size_t length, uint8_t* dst) const;

 private:
  int map(int fd, uint64_t size);

  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  int fd_ = -1;  // buffered: what the copies read through
};

}  // namespace pod_init
