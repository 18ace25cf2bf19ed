#include "pod_init/direct_reader.hpp"

#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>

#include "pod_init/error.hpp"

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

uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

bool is_aligned(const void* p, uint64_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

}  // namespace

// One read issued to the kernel: [offset, offset + length) into `io` (the
// caller's memory, or a bounce slot). Of it, the caller wants [want_lo, want_hi),
// copied to `copy_to` when it went through a slot.
struct DirectReader::Piece {
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

DirectReader::DirectReader(std::string path, unsigned queue_depth, BackendChoice backend)
    : path_(std::move(path)), depth_(queue_depth), choice_(backend) {
  if (queue_depth < 1 || queue_depth > 4096) {
    throw InputError("", 0,
                     "queue_depth must be from 1 to 4096, not " + std::to_string(queue_depth));
  }
  register_atfork();
  int rc = open_direct(path_, &file_);
  if (rc < 0) throw SysError(-rc, path_);
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    ensure_backend();
  } catch (...) {
    close_direct(&file_);
    throw;
  }
}

DirectReader::~DirectReader() { close(); }

void DirectReader::close() {
  if (fork_generation_ != g_fork_generation.load()) {
    // A child closing a reader it inherited: the parent's pool, ring and threads are not here.
    (void)pool_.release();
    (void)backend_.release();
  }
  backend_.reset();
  pool_.reset();
  close_direct(&file_);
}

void DirectReader::check_open() const {
  if (closed()) throw InputError("", 0, path_ + ": the reader is closed");
}

void DirectReader::check_range(uint64_t offset, uint64_t length) {
  // File offsets are off_t: past INT64_MAX the kernel cannot address them.
  if (offset > INT64_MAX || length > INT64_MAX - offset) {
    throw InputError("", 0, "offset + length overflows the largest file offset");
  }
}

std::string DirectReader::backend() const {
  return backend_ ? backend_->name() : (choice_ == BackendChoice::Pread ? "pread" : "io_uring");
}

std::string DirectReader::backend_note() const {
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
  if (rc < 0) throw SysError(-rc, path_ + " (bounce buffers)");
  backend_note_.clear();
  if (choice_ != BackendChoice::Pread) {
    rc = make_uring_backend(file_.fd, depth_, pool_.get(), &backend_);
    if (rc < 0 && choice_ == BackendChoice::IoUring) throw SysError(-rc, path_ + " (io_uring)");
    if (rc < 0)
      backend_note_ = "io_uring unavailable (" + errno_name(-rc) + "): " + errno_text(-rc);
  }
  if (!backend_) backend_ = make_pread_backend(file_.fd, depth_);
  backend_thread_ = std::this_thread::get_id();
}

void DirectReader::plan(uint64_t offset, uint64_t length, uint8_t* dst, bool dst_is_span,
                        std::vector<Piece>* pieces) {
  const uint64_t align = file_.offset_align;
  const uint64_t start = align_down(offset, align);
  const uint64_t end = align_up(offset + length, align);
  // Straight into the caller's memory when the kernel can DMA there as asked.
  const bool direct_ok = dst_is_span || (start == offset && end == offset + length &&
                                         is_aligned(dst, file_.memory_align));
  const uint64_t step = direct_ok ? kMaxIo : kSlotSize;
  for (uint64_t at = start; at < end; at += step) {
    Piece piece;
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
  int64_t failure =
      0;  // the first -errno; no new reads after it, but every issued one is waited for
  auto submit = [&](Piece& piece, uint64_t tag) {
    piece.submitted_ns = now_ns();
    int rc = backend_->submit({tag, piece.io, piece.offset, piece.length});
    if (rc < 0) {
      failure = rc;
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
      throw SysError(-rc, path_ + " (io backend failed with reads in flight)");
    }
    uint64_t done_ns = now_ns();
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
    throw SysError(static_cast<int>(-failure), path_);
  }
}

DirectReader::Span DirectReader::read(uint64_t offset, uint64_t length) {
  check_open();
  check_range(offset, length);
  if (length > kLargeRead) {
    // Allocate no more than the file can give; small reads skip this system call.
    uint64_t size = 0;
    int rc = current_size(file_, &size);
    if (rc < 0) throw SysError(-rc, path_);
    length = std::min(length, offset < size ? size - offset : 0);
  }
  Span span;
  const uint64_t align = file_.offset_align;
  const uint64_t start = align_down(offset, align);
  span.buffer = AlignedBuffer(length == 0 ? 0 : align_up(offset + length, align) - start);
  if (span.buffer.data() == nullptr) throw SysError(ENOMEM, path_);
  span.head = offset - start;
  if (length == 0) return span;
  std::vector<Piece> pieces;
  plan(offset, length, span.buffer.data(), true, &pieces);
  std::lock_guard<std::mutex> lock(mutex_);
  ensure_backend();
  run(&pieces);
  span.length = contiguous_bytes(pieces);
  ++stats_.reads;
  stats_.bytes += span.length;
  return span;
}

size_t DirectReader::read_into(uint8_t* dst, size_t length, uint64_t offset) {
  check_open();
  check_range(offset, length);
  if (length == 0) return 0;
  std::vector<Piece> pieces;
  plan(offset, length, dst, false, &pieces);
  std::lock_guard<std::mutex> lock(mutex_);
  ensure_backend();
  run(&pieces);
  size_t total = contiguous_bytes(pieces);
  ++stats_.reads;
  stats_.bytes += total;
  return total;
}

AlignedBuffer DirectReader::read_batch(const std::vector<uint64_t>& offsets, size_t length) {
  check_open();
  if (length != 0 && offsets.size() > SIZE_MAX / length) {
    throw InputError("", 0, "offsets x length overflows");
  }
  AlignedBuffer out(offsets.size() * length);
  if (out.data() == nullptr) throw SysError(ENOMEM, path_);
  read_batch_into(offsets, length, out.data());
  return out;
}

void DirectReader::read_batch_into(const std::vector<uint64_t>& offsets, size_t length,
                                   uint8_t* dst) {
  check_open();
  uint64_t size = 0;
  int rc = current_size(file_, &size);
  if (rc < 0) throw SysError(-rc, path_);
  for (uint64_t offset : offsets) {
    check_range(offset, length);
    if (offset > size || length > size - offset) {
      throw InputError("", 0,
                       path_ + ": the window at offset " + std::to_string(offset) + " (" +
                           std::to_string(length) + " bytes) ends past the end of the file (" +
                           std::to_string(size) + " bytes)");
    }
  }
  if (length == 0 || offsets.empty()) return;
  std::vector<Piece> pieces;
  for (size_t i = 0; i < offsets.size(); ++i)
    plan(offsets[i], length, dst + i * length, false, &pieces);
  std::lock_guard<std::mutex> lock(mutex_);
  ensure_backend();
  run(&pieces);
  if (contiguous_bytes(pieces) < offsets.size() * length) {
    // Checked against the size above: the file shrank while we read.
    throw SysError(ENODATA, path_ + " (shrank while reading)");
  }
  stats_.reads += offsets.size();
  stats_.bytes += offsets.size() * length;
}

ReaderStats DirectReader::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace pod_init
