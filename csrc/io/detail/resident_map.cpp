#include "io/detail/resident_map.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <utility>
#include <vector>

namespace pod_init {

namespace {

uint64_t page_size() {
  static const uint64_t size = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return size;
}

}  // namespace

ResidentMap::~ResidentMap() { close(); }

ResidentMap::ResidentMap(ResidentMap&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      fd_(std::exchange(other.fd_, -1)) {}

ResidentMap& ResidentMap::operator=(ResidentMap&& other) noexcept {
  if (this != &other) {
    close();
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

int ResidentMap::open(const std::string& path, int direct_fd, uint64_t size) {
  close();
  // O_NONBLOCK: should the path be a FIFO by now, the open must not wait for a writer.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return -errno;
  struct stat direct {
  }, buffered{};
  if (fstat(direct_fd, &direct) != 0 || fstat(fd, &buffered) != 0) {
    int err = errno;
    ::close(fd);
    return -err;
  }
  if (direct.st_dev != buffered.st_dev || direct.st_ino != buffered.st_ino) {
    ::close(fd);
    return -ESTALE;  // renamed over between the two opens
  }
  fd_ = fd;
  int rc = map(fd_, size);
  if (rc < 0) close();
  return rc;
}

int ResidentMap::open_like(const ResidentMap& other) {
  close();
  if (other.fd_ < 0) return 0;
  if ((fd_ = fcntl(other.fd_, F_DUPFD_CLOEXEC, 0)) < 0) return -errno;
  int rc = map(fd_, other.size_);
  if (rc < 0) close();
  return rc;
}

int ResidentMap::map(int fd, uint64_t size) {
  if (size == 0) return 0;
  void* base = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return -errno;
  // The mapping is only asked about residency, never read: no read-around.
  madvise(base, size, MADV_RANDOM);
  base_ = static_cast<uint8_t*>(base);
  size_ = size;
  return 0;
}

void ResidentMap::close() {
  if (base_ != nullptr) munmap(base_, size_);
  if (fd_ >= 0) ::close(fd_);
  base_ = nullptr;
  size_ = 0;
  fd_ = -1;
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
  // RWF_NOWAIT: a page evicted since mincore() fails the copy (EAGAIN) instead
  // of waiting for the device; the row is then read directly like any other.
  size_t done = 0;
  bool nowait = true;
  while (done < length) {
    iovec part{dst + done, length - done};
    ssize_t n = preadv2(fd_, &part, 1, static_cast<off_t>(offset + done), nowait ? RWF_NOWAIT : 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && nowait && (errno == EOPNOTSUPP || errno == EINVAL)) {
      nowait = false;  // a kernel or filesystem without RWF_NOWAIT for buffered reads
      continue;
    }
    if (n <= 0) return false;  // EAGAIN, an error, or the file shrank (0: end of file)
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace pod_init
