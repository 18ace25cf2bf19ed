#include "io/direct_reader.hpp"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>

#include "common/clock.hpp"
#include "common/error.hpp"

namespace pod_init {

namespace {

// Bumped in every forked child, so a reader notices it changed process with one
// load instead of a getpid() system call per read.
std::atomic<uint64_t> g_fork_generation{1};
std::once_flag g_atfork_once;

void register_atfork() {
  std::call_once(g_atfork_once,
                 [] { pthread_atfork(nullptr, nullptr, [] { g_fork_generation.fetch_add(1); }); });
}

bool is_aligned(const void* p, uint64_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

}  // namespace

// One read issued to the kernel: [offset, offset + length) into `io` (the
// caller's memory, or a bounce slot). Of it, the caller wants [want_lo, want_hi),
// copied to `copy_to` when it went through a slot.
struct DirectReader::Piece {
  uint32_t file = 0;
  uint64_t offset = 0;
  uint32_t length = 0;
  uint8_t* io = nullptr;  // nullptr: take a bounce slot when submitting
  uint64_t want_lo = 0, want_hi = 0;
  uint8_t* copy_to = nullptr;
  uint64_t submitted_ns = 0;
  int64_t result = 0;
  uint64_t delivered = 0;  // bytes of [want_lo, want_hi) that arrived
};

// The wanted bytes that arrived, up to the first piece that came back short
// (the end of the file).
uint64_t DirectReader::contiguous_bytes(const std::vector<Piece>& pieces) {
  uint64_t total = 0;
  for (const Piece& piece : pieces) {
    total += piece.delivered;
    if (piece.delivered < piece.want_hi - piece.want_lo) break;
  }
  return total;
}

DirectReader::DirectReader(std::vector<std::string> paths, int64_t queue_depth,
                           BackendChoice backend, bool page_cache)
    : paths_(std::move(paths)),
      depth_(static_cast<unsigned>(std::clamp<int64_t>(queue_depth, 1, kMaxQueueDepth))),
      choice_(backend),
      page_cache_(page_cache) {
  if (queue_depth < 1 || queue_depth > kMaxQueueDepth) {
    throw InputError("", 0,
                     "queue_depth must be from 1 to " + std::to_string(kMaxQueueDepth) + ", not " +
                         std::to_string(queue_depth));
  }
  if (paths_.empty()) throw InputError("", 0, "no files to read");
  register_atfork();
  try {
    for (const std::string& path : paths_) {
      DirectFile file;
      int rc = open_direct(path, &file);
      if (rc < 0) throw SysError(-rc, "open", path);
      files_.push_back(file);
      if (page_cache_) {
        ResidentMap map;
        if ((rc = map.map(file.fd, file.size)) < 0) throw SysError(-rc, "mmap", path);
        resident_.push_back(std::move(map));
      }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    ensure_backend();
  } catch (...) {
    close();
    throw;
  }
}

DirectReader::~DirectReader() { close(); }

void DirectReader::close() {
  // Other threads may be reading: they hold mutex_ for their whole call, so the
  // files, ring and pool go only between calls, and later calls see closed().
  std::lock_guard<std::mutex> lock(mutex_);
  if (fork_generation_ != g_fork_generation.load()) {
    // A child closing a reader it inherited: the parent's pool, ring and threads are not here.
    (void)pool_.release();
    (void)backend_.release();
  }
  backend_.reset();
  pool_.reset();
  resident_.clear();
  for (DirectFile& file : files_) close_direct(&file);
}

uint32_t DirectReader::block_size() const {
  uint32_t align = 0;
  for (const DirectFile& file : files_) align = std::max(align, file.offset_align);
  return align;
}

uint32_t DirectReader::memory_alignment() const {
  uint32_t align = 0;
  for (const DirectFile& file : files_) align = std::max(align, file.memory_align);
  return align;
}

bool DirectReader::direct() const {
  return std::all_of(files_.begin(), files_.end(), [](const DirectFile& f) { return f.direct; });
}

void DirectReader::check_open(uint32_t file) const {
  if (closed()) throw InputError("", 0, "I/O on a closed reader (" + paths_[0] + ")");
  if (file >= files_.size()) {
    throw InputError("", 0,
                     "file index " + std::to_string(file) + " out of range: the reader has " +
                         std::to_string(files_.size()) + " files");
  }
}

void DirectReader::check_range(uint64_t offset, uint64_t length) {
  // File offsets are off_t: past INT64_MAX the kernel cannot address them.
  if (offset > INT64_MAX || length > INT64_MAX - offset) {
    throw InputError("", 0, "offset + length overflows the largest file offset");
  }
}

void DirectReader::check_window(uint32_t file, uint64_t offset, uint64_t length) {
  check_open(file);
  check_range(offset, length);
  uint64_t size = files_[file].size;
  if (offset <= size && length <= size - offset) return;
  // Past the size at open: the file may have grown since.
  int rc = current_size(files_[file], &size);
  if (rc < 0) throw SysError(-rc, "fstat", paths_[file]);
  if (offset > size || length > size - offset) {
    throw InputError("", 0,
                     paths_[file] + ": the window at offset " + std::to_string(offset) + " (" +
                         std::to_string(length) + " bytes) ends past the end of the file (" +
                         std::to_string(size) + " bytes)");
  }
}

std::string DirectReader::backend() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return backend_ ? backend_->name() : (choice_ == BackendChoice::Pread ? "pread" : "io_uring");
}

std::string DirectReader::backend_note() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string io_note = backend_ ? backend_->note() : "";
  if (backend_note_.empty()) return io_note;
  return io_note.empty() ? backend_note_ : backend_note_ + "; " + io_note;
}

void DirectReader::ensure_backend() {
  uint64_t generation = g_fork_generation.load();
  if (generation == fork_generation_ && backend_) {
    if (!backend_->single_thread() || backend_thread_ == std::this_thread::get_id()) return;
    // Another thread: the ring refuses it (single issuer). Nothing is in
    // flight here (mutex_ is held), so a new ring for this thread is safe.
    backend_.reset();
  }
  if (fork_generation_ != 0 && generation != fork_generation_) {
    // First use in a forked child: the parent's pool is not mapped here
    // (MADV_DONTFORK) and its threads do not exist; leave them be.
    (void)pool_.release();
    (void)backend_.release();
    stats_ = {};
  }
  fork_generation_ = generation;
  pool_ = std::make_unique<BufferPool>();
  int rc = pool_->init(kSlotSize, depth_);
  if (rc < 0) throw SysError(-rc, "map bounce buffers");
  backend_note_.clear();
  std::vector<int> fds;
  for (const DirectFile& file : files_) fds.push_back(file.fd);
  if (choice_ != BackendChoice::Pread) {
    rc = make_uring_backend(fds, depth_, pool_.get(), &backend_);
    if (rc < 0 && choice_ == BackendChoice::IoUring) {
      throw SysError(-rc, "io_uring_setup");
    }
    if (rc < 0)
      backend_note_ = "io_uring unavailable (" + errno_name(-rc) + "): " + errno_text(-rc);
  }
  if (!backend_) backend_ = make_pread_backend(std::move(fds), depth_);
  backend_thread_ = std::this_thread::get_id();
}

void DirectReader::plan(uint32_t file, uint64_t offset, uint64_t length, uint8_t* dst,
                        bool dst_is_span, std::vector<Piece>* pieces) {
  const uint64_t align = files_[file].offset_align;
  const uint64_t start = align_down(offset, align);
  const uint64_t end = align_up(offset + length, align);
  // Straight into the caller's memory when the kernel can DMA there as asked.
  const bool direct_ok = dst_is_span || (start == offset && end == offset + length &&
                                         is_aligned(dst, files_[file].memory_align));
  const uint64_t step = direct_ok ? kMaxIo : kSlotSize;
  for (uint64_t at = start; at < end; at += step) {
    Piece piece;
    piece.file = file;
    piece.offset = at;
    piece.length = static_cast<uint32_t>(std::min(step, end - at));
    piece.want_lo = std::max(at, offset);
    piece.want_hi = std::min(at + piece.length, offset + length);
    if (direct_ok) {
      piece.io = dst + (at - (dst_is_span ? start : offset));
    } else {
      piece.copy_to = dst + (piece.want_lo - offset);
    }
    pieces->push_back(piece);
  }
}

void DirectReader::run(std::vector<Piece>* pieces) {
  std::vector<IoCompletion> completions;
  size_t next = 0, in_flight = 0;
  // The first -errno and its file; no new reads after it, but every issued one is waited for.
  int64_t failure = 0;
  uint32_t failed_file = 0;
  auto submit = [&](Piece& piece, uint64_t tag) {
    piece.submitted_ns = monotonic_ns();
    int rc = backend_->submit({tag, piece.file, piece.io, piece.offset, piece.length});
    if (rc < 0) {
      failure = rc;
      failed_file = piece.file;
    } else {
      ++in_flight;
    }
  };
  while ((next < pieces->size() && failure == 0) || in_flight > 0) {
    while (next < pieces->size() && in_flight < depth_ && failure == 0) {
      Piece& piece = (*pieces)[next];
      if (piece.io == nullptr && (piece.io = pool_->acquire()) == nullptr) break;
      submit(piece, next++);
    }
    if (in_flight == 0) break;
    completions.clear();
    int rc = backend_->reap(&completions);
    if (rc < 0) {
      // The kernel may still write into these buffers: nothing safe remains to do.
      throw SysError(-rc, "wait for reads in flight");
    }
    uint64_t done_ns = monotonic_ns();
    for (const IoCompletion& completion : completions) {
      Piece& piece = (*pieces)[completion.tag];
      --in_flight;
      if ((completion.result == -EAGAIN || completion.result == -EINTR) && failure == 0) {
        submit(piece, completion.tag);
        continue;
      }
      stats_.io_latency.record(done_ns - piece.submitted_ns);
      ++stats_.ios;
      piece.result = completion.result;
      if (completion.result < 0) {
        if (failure == 0) failed_file = piece.file;
        if (failure == 0) failure = completion.result;
      } else {
        uint64_t hi =
            std::min(piece.offset + static_cast<uint64_t>(completion.result), piece.want_hi);
        piece.delivered = hi > piece.want_lo ? hi - piece.want_lo : 0;
      }
      if (piece.copy_to != nullptr) {
        std::memcpy(piece.copy_to, piece.io + (piece.want_lo - piece.offset), piece.delivered);
        pool_->release(piece.io);
        piece.io = nullptr;
      }
    }
  }
  if (failure < 0) {
    for (Piece& piece : *pieces) {
      if (piece.copy_to != nullptr && piece.io != nullptr) pool_->release(piece.io);
      if (piece.copy_to != nullptr) piece.io = nullptr;
    }
    throw SysError(static_cast<int>(-failure), "read", paths_[failed_file]);
  }
}

DirectReader::Span DirectReader::read(uint64_t offset, uint64_t length, uint32_t file) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_open(file);
  check_range(offset, length);
  if (length > kLargeRead) {
    // Allocate no more than the file can give; small reads skip this system call.
    uint64_t size = 0;
    int rc = current_size(files_[file], &size);
    if (rc < 0) throw SysError(-rc, "fstat", paths_[file]);
    length = std::min(length, offset < size ? size - offset : 0);
  }
  Span span;
  const uint64_t align = files_[file].offset_align;
  const uint64_t start = align_down(offset, align);
  span.buffer = AlignedBuffer(length == 0 ? 0 : align_up(offset + length, align) - start);
  if (span.buffer.data() == nullptr)
    throw SysError(ENOMEM, "allocate a buffer to read", paths_[file]);
  span.head = offset - start;
  if (length == 0) return span;
  std::vector<Piece> pieces;
  plan(file, offset, length, span.buffer.data(), true, &pieces);
  ensure_backend();
  run(&pieces);
  span.length = contiguous_bytes(pieces);
  ++stats_.reads;
  stats_.bytes += span.length;
  return span;
}

size_t DirectReader::read_into(uint8_t* dst, size_t length, uint64_t offset, uint32_t file) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_open(file);
  check_range(offset, length);
  if (length == 0) return 0;
  std::vector<Piece> pieces;
  plan(file, offset, length, dst, false, &pieces);
  ensure_backend();
  run(&pieces);
  size_t total = contiguous_bytes(pieces);
  ++stats_.reads;
  stats_.bytes += total;
  return total;
}

AlignedBuffer DirectReader::read_batch(const std::vector<uint64_t>& offsets, size_t length,
                                       const std::vector<uint32_t>& files) {
  if (length != 0 && offsets.size() > SIZE_MAX / length) {
    throw InputError("", 0, "offsets x length overflows");
  }
  AlignedBuffer out(offsets.size() * length);
  if (out.data() == nullptr) throw SysError(ENOMEM, "allocate a batch buffer");
  read_batch_into(offsets, length, out.data(), files);
  return out;
}

void DirectReader::read_batch_into(const std::vector<uint64_t>& offsets, size_t length,
                                   uint8_t* dst, const std::vector<uint32_t>& files) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_open(0);
  if (!files.empty() && files.size() != offsets.size()) {
    throw InputError("", 0,
                     std::to_string(offsets.size()) + " offsets but " +
                         std::to_string(files.size()) + " file indices");
  }
  auto file_of = [&](size_t row) { return files.empty() ? 0u : files[row]; };
  for (size_t i = 0; i < offsets.size(); ++i) check_window(file_of(i), offsets[i], length);
  if (length == 0 || offsets.empty()) return;
  std::vector<Piece> pieces;
  uint64_t from_cache = 0;
  for (size_t i = 0; i < offsets.size(); ++i) {
    uint8_t* row = dst + i * length;
    if (page_cache_ && resident_[file_of(i)].copy_if_resident(offsets[i], length, row)) {
      ++from_cache;
      continue;
    }
    plan(file_of(i), offsets[i], length, row, false, &pieces);
  }
  ensure_backend();
  run(&pieces);
  for (const Piece& piece : pieces) {
    // Checked against the size above: the file shrank while we read.
    if (piece.delivered < piece.want_hi - piece.want_lo) {
      throw SysError(ENODATA, "read (the file shrank since it was opened)", paths_[piece.file]);
    }
  }
  stats_.reads += offsets.size();
  stats_.bytes += offsets.size() * length;
  stats_.page_cache_reads += from_cache;
}

ReaderStats DirectReader::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace pod_init
