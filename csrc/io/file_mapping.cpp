#include "io/file_mapping.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "io/aligned_buffer.hpp"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14; older headers lack it
#endif

namespace pod_init {

FileMapping::~FileMapping() {
  if (data_ != nullptr) munmap(data_, size_);
}

FileMapping::FileMapping(FileMapping&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

FileMapping& FileMapping::operator=(FileMapping&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

int FileMapping::map(const std::string& path, uint64_t offset, size_t length, FileMapping* out) {
  const long page = sysconf(_SC_PAGESIZE);
  if (length == 0 || offset % static_cast<uint64_t>(page) != 0) return -EINVAL;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  struct stat st {};
  int rc = 0;
  if (fstat(fd, &st) != 0) {
    rc = -errno;
  } else if (offset > static_cast<uint64_t>(st.st_size) ||
             length > static_cast<uint64_t>(st.st_size) - offset) {
    rc = -ENODATA;
  } else {
    void* data =
        mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, static_cast<off_t>(offset));
    if (data == MAP_FAILED) {
      rc = -errno;
    } else {
      *out = FileMapping();
      out->data_ = static_cast<uint8_t*>(data);
      out->size_ = length;
    }
  }
  close(fd);
  return rc;
}

int populate_read(const uint8_t* data, size_t length) {
  if (length == 0) return 0;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t start = align_down(reinterpret_cast<uint64_t>(data), page);
  const uint64_t end = reinterpret_cast<uint64_t>(data) + length;
  if (madvise(reinterpret_cast<void*>(start), end - start, MADV_POPULATE_READ) == 0) return 0;
  if (errno != EINVAL) return -errno;  // EFAULT: past the file's end; ENOMEM: not mapped
  // A kernel before 5.14: one read in each page faults it in.
  volatile uint8_t sink = 0;
  for (uint64_t page_start = start; page_start < end; page_start += page) {
    const uint64_t byte = std::max(page_start, reinterpret_cast<uint64_t>(data));
    sink = sink ^ *reinterpret_cast<const volatile uint8_t*>(byte);
  }
  return 0;
}

}  // namespace pod_init
