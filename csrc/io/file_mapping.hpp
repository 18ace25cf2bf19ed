// A stretch of a file mapped privately: what a load from a file that is read
// through the page cache anyway (a loop device without its own direct IO)
// hands out, so that the page cache's own pages become the tensors' memory
// instead of being copied into fresh memory. A page written to becomes the
// process's own copy; the file never changes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pod_init {

class FileMapping {
 public:
  FileMapping() = default;
  ~FileMapping();
  FileMapping(FileMapping&& other) noexcept;
  FileMapping& operator=(FileMapping&& other) noexcept;
  FileMapping(const FileMapping&) = delete;
  FileMapping& operator=(const FileMapping&) = delete;

  // Maps [offset, offset + length) of `path` (offset a multiple of the page
  // size, length > 0, within the file: a page past its end would fault with
  // SIGBUS when touched). 0 or -errno (-EINVAL for a bad offset or length,
  // -ENODATA for a range past the end). The descriptor is closed once mapped.
  static int map(const std::string& path, uint64_t offset, size_t length, FileMapping* out);

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Faults [data, data + length) of a mapping in from the page cache, reading
// what is not cached: MADV_POPULATE_READ, which copies no page of a private
// mapping; before Linux 5.14, a read of each page. 0 or -errno.
int populate_read(const uint8_t* data, size_t length);

}  // namespace pod_init
