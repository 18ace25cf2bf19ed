// Opening a file or raw block device for O_DIRECT IO: the alignment the
// kernel wants, the size, and a buffered fallback where O_DIRECT is refused.
#pragma once

#include <cstdint>
#include <string>

namespace pod_init {

struct DirectFile {
  int fd = -1;
  bool direct = false;  // false: O_DIRECT was refused (EINVAL) and reads go through the page cache
  bool block_device = false;
  uint64_t size = 0;             // at open
  uint32_t offset_align = 0;     // file offsets and lengths must be multiples of this
  uint32_t memory_align = 0;     // buffer addresses must be multiples of this
  std::string alignment_source;  // "statx", "logical block size" or "default"
};

// Returns 0 or -errno (-EISDIR for a directory, -EINVAL for other files that
// cannot be read at offsets, like pipes). Never leaves a descriptor open on failure.
int open_direct(const std::string& path, DirectFile* file);

// Fills `file` for an open descriptor (its type, size and alignment); the
// caller keeps fd on failure. Returns 0 or -errno (-EISDIR, -EINVAL as above).
int describe_direct(int fd, bool direct, DirectFile* file);

// The size now (files grow and shrink while open). Returns 0 or -errno.
int current_size(const DirectFile& file, uint64_t* size);

void close_direct(DirectFile* file);

}  // namespace pod_init
