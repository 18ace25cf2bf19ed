#include "io/detail/direct_file.hpp"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace pod_init {

namespace {

// The kernel's struct statx (linux/stat.h, 6.1 and later): glibc 2.36's copy
// lacks the direct-IO alignment fields.
struct KernelStatx {
  uint32_t mask;
  uint32_t blksize;
  uint64_t attributes;
  uint32_t nlink, uid, gid;
  uint16_t mode, spare0;
  uint64_t ino, size, blocks, attributes_mask;
  uint64_t timestamps[8];  // atime, btime, ctime, mtime: {sec, nsec + pad}
  uint32_t rdev_major, rdev_minor, dev_major, dev_minor;
  uint64_t mnt_id;
  uint32_t dio_mem_align, dio_offset_align;
  uint64_t spare3[12];
};
static_assert(sizeof(KernelStatx) == 256, "struct statx is 256 bytes");

constexpr uint32_t kStatxType = 0x1, kStatxSize = 0x200, kStatxDioAlign = 0x2000;
constexpr uint32_t kDefaultAlign = 4096;

int kernel_statx(int fd, uint32_t mask, KernelStatx* out) {
  std::memset(out, 0, sizeof *out);
  long rc = syscall(SYS_statx, fd, "", AT_EMPTY_PATH, mask, out);
  return rc < 0 ? -errno : 0;
}

int block_device_size(int fd, uint64_t* size) {
  return ioctl(fd, BLKGETSIZE64, size) < 0 ? -errno : 0;
}

}  // namespace

int open_direct(const std::string& path, DirectFile* file) {
  *file = {};
  // O_NONBLOCK so a FIFO cannot hang the open; cleared below for the files we keep.
  int fd = open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC | O_NONBLOCK);
  bool direct = true;
  if (fd < 0 && errno == EINVAL) {
    // The filesystem has no direct IO (ramfs, some FUSE and overlay stacks).
    fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    direct = false;
  }
  if (fd < 0) return -errno;

  int rc = describe_direct(fd, direct, file);
  if (rc < 0) close(fd);
  return rc;
}

int describe_direct(int fd, bool direct, DirectFile* file) {
  *file = {};
  KernelStatx st;
  int rc = kernel_statx(fd, kStatxType | kStatxSize | kStatxDioAlign, &st);
  uint32_t type = st.mode & S_IFMT;
  if (rc == 0 && type == S_IFDIR) rc = -EISDIR;
  if (rc == 0 && type != S_IFREG && type != S_IFBLK) rc = -EINVAL;
  // Clears the O_NONBLOCK of open_direct(), keeping the access mode's flags.
  int flags = fcntl(fd, F_GETFL);
  if (rc == 0 &&
      (flags < 0 || fcntl(fd, F_SETFL, (flags & ~O_NONBLOCK) | (direct ? O_DIRECT : 0)) < 0)) {
    rc = -errno;
  }
  if (rc < 0) return rc;
  file->fd = fd;
  file->direct = direct;
  file->block_device = type == S_IFBLK;
  file->size = st.size;
  if (file->block_device && (rc = block_device_size(fd, &file->size)) < 0) {
    file->fd = -1;
    return rc;
  }
  int logical = 0;
  if ((st.mask & kStatxDioAlign) && st.dio_offset_align > 0) {
    file->offset_align = st.dio_offset_align;
    file->memory_align = st.dio_mem_align;
    file->alignment_source = "statx";
  } else if (file->block_device && ioctl(fd, BLKSSZGET, &logical) == 0 && logical > 0) {
    file->offset_align = file->memory_align = static_cast<uint32_t>(logical);
    file->alignment_source = "logical block size";
  } else {
    file->offset_align = file->memory_align = kDefaultAlign;
    file->alignment_source = "default";
  }
  return 0;
}

int current_size(const DirectFile& file, uint64_t* size) {
  if (file.block_device) return block_device_size(file.fd, size);
  KernelStatx st;
  int rc = kernel_statx(file.fd, kStatxSize, &st);
  if (rc == 0) *size = st.size;
  return rc;
}

void close_direct(DirectFile* file) {
  if (file->fd >= 0) close(file->fd);
  file->fd = -1;
}

}  // namespace pod_init
