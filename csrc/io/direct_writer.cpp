#include "io/direct_writer.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "common/crc32c.hpp"
#include "common/error.hpp"
#include "io/aligned_buffer.hpp"
#include "io/detail/direct_file.hpp"
#include "io/detail/io_backend.hpp"
#include "io/detail/piece_queue.hpp"

namespace pod_init {

namespace {

std::atomic<uint64_t> g_temporaries{0};

std::string hidden_prefix(const std::string& name) { return "." + name + ".pod-init-"; }

// ".NAME.pod-init-PID-N": the PID tells a later writer whether its owner still runs.
std::string temporary_name(const std::string& name) {
  return hidden_prefix(name) + std::to_string(getpid()) + "-" +
         std::to_string(g_temporaries.fetch_add(1));
}

// Opens a new file in the folder for writing: unnamed where the filesystem
// can (O_TMPFILE), else under a hidden name; direct where it allows. Returns
// the descriptor or -errno.
int create_file(int folder_fd, const std::string& name, bool* direct, std::string* temp_name) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    *direct = attempt == 0;
    int flags = O_WRONLY | O_CLOEXEC | (*direct ? O_DIRECT : 0);
    int fd = openat(folder_fd, ".", O_TMPFILE | flags, 0644);
    if (fd >= 0) return fd;
    if (errno == EOPNOTSUPP || errno == EISDIR || errno == ENOENT) {
      // No O_TMPFILE here: a hidden name that a later writer can clean up.
      *temp_name = temporary_name(name);
      fd = openat(folder_fd, temp_name->c_str(), O_CREAT | O_EXCL | flags, 0644);
      if (fd >= 0) return fd;
      temp_name->clear();
    }
    if (errno != EINVAL) return -errno;  // EINVAL: the filesystem refuses O_DIRECT
  }
  return -EINVAL;
}

std::string hex32(uint32_t value) {
  char text[9];
  std::snprintf(text, sizeof text, "%08x", value);
  return text;
}

}  // namespace

int DirectWriter::remove_stale_temporaries(const std::string& path) {
  size_t slash = path.rfind('/');
  std::string folder = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  std::string prefix = hidden_prefix(path.substr(slash == std::string::npos ? 0 : slash + 1));
  DIR* dir = opendir(folder.c_str());
  if (dir == nullptr) return 0;
  int removed = 0;
  while (dirent* entry = readdir(dir)) {
    std::string name = entry->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
    // Only a writer that is gone: a running one is still writing it.
    if (pid <= 0 || pid == getpid() || kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) {
      continue;
    }
    if (unlinkat(dirfd(dir), name.c_str(), 0) == 0) ++removed;
  }
  closedir(dir);
  return removed;
}

DirectWriter::DirectWriter(std::string path, uint64_t expected_size, int64_t queue_depth,
                           uint64_t head_bytes)
    : path_(std::move(path)),
      names_{path_},
      head_bytes_(head_bytes),
      written_(head_bytes),
      submitted_(head_bytes) {
  if (queue_depth < 1 || queue_depth > 4096) {
    throw InputError("", 0,
                     "queue_depth must be from 1 to 4096, not " + std::to_string(queue_depth));
  }
  if (head_bytes % kHeadAlign != 0) {
    throw InputError("", 0,
                     "head_bytes must be a multiple of " + std::to_string(kHeadAlign) + ", not " +
                         std::to_string(head_bytes));
  }
  check_path(path_);
  if (path_.empty() || path_.back() == '/')
    throw InputError("", 0, "'" + path_ + "' names no file");
  depth_ = static_cast<unsigned>(queue_depth);
  size_t slash = path_.rfind('/');
  folder_ = slash == std::string::npos ? "." : (slash == 0 ? "/" : path_.substr(0, slash));
  name_ = path_.substr(slash == std::string::npos ? 0 : slash + 1);
  try {
    if ((folder_fd_ = ::open(folder_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
      throw SysError(errno, "open the folder of", path_);
    }
    remove_stale_temporaries(path_);
    bool direct = false;
    fd_ = create_file(folder_fd_, name_, &direct, &temp_name_);
    if (fd_ < 0) throw SysError(-fd_, "create", path_);
    if (!temp_name_.empty()) note_ = "no O_TMPFILE: written under " + temp_name_;
    DirectFile file;
    if (int rc = describe_direct(fd_, direct, &file); rc < 0) throw SysError(-rc, "stat", path_);
    direct_ = file.direct;
    offset_align_ = file.offset_align;
    // A disk without room fails here, before anything is written. Checked, not
    // fallocate()d: O_DIRECT writes into preallocated (unwritten) extents pay
    // for converting them, 20-30 % of the bandwidth on ext4 here.
    struct statvfs room {};
    if (expected_size > 0 && fstatvfs(fd_, &room) == 0 &&
        static_cast<uint64_t>(room.f_bavail) * room.f_frsize < expected_size) {
      throw SysError(ENOSPC, "find room for " + std::to_string(expected_size) + " bytes for",
                     path_);
    }
    make_backend();
  } catch (...) {
    discard();
    throw;
  }
}

DirectWriter::~DirectWriter() { discard(); }

void DirectWriter::check_open() const {
  if (fd_ < 0) throw InputError("", 0, "write to a closed writer (" + path_ + ")");
}

void DirectWriter::make_backend() {
  std::string fallback;
  backend_ = choose_backend(BackendChoice::Auto, {fd_}, depth_, nullptr, &fallback);
  if (!fallback.empty() && note_.find(fallback) == std::string::npos)
    note_ += std::string(note_.empty() ? "" : "; ") + fallback;
  queue_ = std::make_unique<PieceQueue>(backend_.get(), nullptr, &names_, &counters_);
  backend_thread_ = std::this_thread::get_id();
}

std::unique_lock<std::mutex> DirectWriter::enter(const char* call) {
  std::unique_lock<std::mutex> hold(busy_, std::try_to_lock);
  if (!hold.owns_lock()) {
    throw InputError(path_, 0,
                     std::string(call) +
                         " while another thread is in a call: a DirectWriter is used by one "
                         "thread at a time");
  }
  if (backend_ && backend_->single_thread() && backend_thread_ != std::this_thread::get_id()) {
    if (!in_flight_.empty()) {
      throw InputError(path_, 0,
                       std::string(call) + " from another thread while " +
                           std::to_string(in_flight_.size()) +
                           " writes of the thread that issued them are in flight (a ring "
                           "takes one submitter): hand a DirectWriter to another thread before "
                           "it has written its first MiB");
    }
    // Nothing in flight: the old ring goes, and this thread gets its own.
    queue_.reset();
    backend_.reset();
    make_backend();
  }
  return hold;
}

uint32_t DirectWriter::write(const uint8_t* data, size_t length) {
  auto hold = enter("write");
  check_open();
  uint32_t crc = 0;
  const size_t total = length;
  try {
    while (length > 0) {
      if (current_.data() == nullptr) {
        if (!spare_.empty()) {
          current_ = std::move(spare_.back());
          spare_.pop_back();
        } else if ((current_ = OwnedBlock(kChunk)).data() == nullptr) {
          throw SysError(ENOMEM, "allocate a staging buffer for", path_);
        }
      }
      size_t n = std::min(length, kChunk - current_fill_);
      std::memcpy(current_.data() + current_fill_, data, n);
      crc = crc32c(crc, data, n);
      current_fill_ += n;
      written_ += n;
      data += n;
      length -= n;
      if (current_fill_ == kChunk) submit_chunk(kChunk);
    }
  } catch (...) {
    discard();
    throw;
  }
  // One pass over the bytes: the call's own CRC, folded into the content's.
  crc_ = crc32c_combine(crc_, crc, total);
  return crc;
}

void DirectWriter::write_head(const uint8_t* data, size_t length) {
  auto hold = enter("write_head");
  check_open();
  if (head_bytes_ == 0 || head_written_) {
    throw InputError(path_, 0,
                     head_written_ ? "write_head: the head is written already"
                                   : "write_head: no head was reserved");
  }
  if (length != head_bytes_) {
    throw InputError(path_, 0,
                     "write_head takes the " + std::to_string(head_bytes_) +
                         " bytes reserved, not " + std::to_string(length));
  }
  try {
    OwnedBlock block(head_bytes_);
    if (block.data() == nullptr) throw SysError(ENOMEM, "allocate the head for", path_);
    std::memcpy(block.data(), data, length);
    crc_ = crc32c_combine(crc32c(0, data, length), crc_, written_ - head_bytes_);
    head_written_ = true;
    submit_block(std::move(block), 0, length);
  } catch (...) {
    discard();
    throw;
  }
}

void DirectWriter::submit_chunk(size_t length) {
  // Only the last block is short; direct IO writes whole blocks, and commit()
  // cuts the padding off with the size.
  size_t padded = align_up(length, offset_align_);
  std::memset(current_.data() + length, 0, padded - length);
  uint64_t offset = submitted_;
  submitted_ += padded;
  current_fill_ = 0;
  submit_block(std::move(current_), offset, padded);
}

void DirectWriter::submit_block(OwnedBlock block, uint64_t offset, size_t padded) {
  Piece piece;
  piece.offset = offset;
  piece.length = static_cast<uint32_t>(padded);
  piece.write = true;
  piece.io = block.data();
  queue_->push(piece);
  in_flight_.push_back(std::move(block));
  queue_->advance();
  if (in_flight_.size() >= depth_) {
    // Every staging block is queued: the oldest comes back for the next bytes.
    queue_->wait_for_first(1);
    queue_->pop_front(1);
    // The head's block is its own size: only blocks that hold a chunk are reused.
    if (in_flight_.front().size() >= kChunk) spare_.push_back(std::move(in_flight_.front()));
    in_flight_.pop_front();
  }
}

uint32_t DirectWriter::commit() {
  auto hold = enter("commit");
  check_open();
  if (head_bytes_ > 0 && !head_written_) {
    throw InputError(path_, 0, "commit before write_head: the reserved head would be zeros");
  }
  try {
    if (current_fill_ > 0) submit_chunk(current_fill_);
    queue_->wait_all();
    if (ftruncate(fd_, static_cast<off_t>(written_)) < 0) throw SysError(errno, "truncate", path_);
    std::string crc = hex32(crc_);
    if (fsetxattr(fd_, kChecksumAttribute, crc.data(), crc.size(), 0) < 0) {
      if (errno != ENOTSUP && errno != EOPNOTSUPP)
        throw SysError(errno, "set the checksum of", path_);
      note_ +=
          std::string(note_.empty() ? "" : "; ") + "the filesystem keeps no checksum attribute";
    }
    // fsync, not fdatasync: the attribute is metadata that must land with the content.
    if (fsync(fd_) < 0) throw SysError(errno, "fsync", path_);
    if (temp_name_.empty()) {
      temp_name_ = temporary_name(name_);
      // AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; /proc/self/fd does not.
      if (linkat(fd_, "", folder_fd_, temp_name_.c_str(), AT_EMPTY_PATH) < 0) {
        std::string self = "/proc/self/fd/" + std::to_string(fd_);
        if (linkat(AT_FDCWD, self.c_str(), folder_fd_, temp_name_.c_str(), AT_SYMLINK_FOLLOW) < 0) {
          int err = errno;
          temp_name_.clear();
          throw SysError(err, "name", path_);
        }
      }
    }
    if (renameat(folder_fd_, temp_name_.c_str(), folder_fd_, name_.c_str()) < 0) {
      throw SysError(errno, "rename over", path_);
    }
    temp_name_.clear();
    if (fsync(folder_fd_) < 0) throw SysError(errno, "fsync the folder of", path_);
  } catch (...) {
    discard();
    throw;
  }
  uint32_t crc = crc_;
  discard();  // closes; nothing is left to discard
  return crc;
}

void DirectWriter::abort() {
  auto hold = enter("abort");
  discard();
}

void DirectWriter::discard() noexcept {
  // After the drain the kernel is done with the staging blocks; when it cannot
  // wait (a writer dropped in a thread other than its ring's), the writes in
  // flight keep their blocks and the ring rather than have them reused.
  if (queue_ && !queue_->drain()) {
    (void)queue_.release();
    (void)backend_.release();
    for (OwnedBlock& block : in_flight_) (void)block.take();
  }
  queue_.reset();
  backend_.reset();
  in_flight_.clear();
  spare_.clear();
  current_.reset();
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  if (!temp_name_.empty() && folder_fd_ >= 0) unlinkat(folder_fd_, temp_name_.c_str(), 0);
  temp_name_.clear();
  if (folder_fd_ >= 0) close(folder_fd_);
  folder_fd_ = -1;
}

}  // namespace pod_init
