#include "io/direct_reader.hpp"

#include <fcntl.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <new>

#include "common/clock.hpp"
#include "common/error.hpp"
#include "common/line_input.hpp"
#include "io/detail/direct_file.hpp"
#include "io/detail/io_backend.hpp"
#include "io/detail/piece_queue.hpp"
#include "io/detail/resident_map.hpp"

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

uint64_t DirectReader::contiguous_bytes(const PieceQueue& queue, size_t count) {
  uint64_t total = 0;
  for (size_t i = 0; i < count; ++i) {
    const Piece& piece = queue.front(i);
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
  check_depth(queue_depth, "queue_depth");
  if (paths_.empty()) throw InputError("", 0, "no files to read");
  register_atfork();
  try {
    for (const std::string& path : paths_) {
      check_path(path);
      DirectFile file;
      int rc = open_direct(path, &file);
      if (rc == -EINVAL) {
        std::string kind = other_kind(path, true);
        if (!kind.empty()) throw InputError(path, 0, kind + ", not a file or block device to read");
      }
      if (rc < 0) throw SysError(-rc, "open", path);
      files_.push_back(file);
      if (page_cache_) {
        ResidentMap map;
        if ((rc = map.open(path, file.fd, file.size)) < 0) {
          throw SysError(-rc, rc == -ESTALE ? "open (replaced while opening)" : "map", path);
        }
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
    drop_batches();
    (void)pool_.release();
    (void)backend_.release();
  }
  batch_queue_.reset();  // waits for the reads in flight: their memory goes next
  batches_.clear();
  backend_.reset();
  pool_.reset();
  resident_.clear();
  for (DirectFile& file : files_) close_direct(&file);
}

uint64_t DirectReader::size(size_t file) const { return files_.at(file).size; }

bool DirectReader::closed() const { return files_.empty() || files_[0].fd < 0; }

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

void DirectReader::check_depth(int64_t depth, const char* what) {
  if (depth < 1 || depth > kMaxQueueDepth) {
    throw InputError("", 0,
                     std::string(what) + " must be from 1 to " + std::to_string(kMaxQueueDepth) +
                         ", not " + std::to_string(depth));
  }
}

void DirectReader::check_rows(const std::vector<uint64_t>& offsets, uint64_t length,
                              const std::vector<uint32_t>& files) {
  check_open(0);
  if (!files.empty() && files.size() != offsets.size()) {
    throw InputError("", 0,
                     std::to_string(offsets.size()) + " offsets but " +
                         std::to_string(files.size()) + " file indices");
  }
  for (size_t i = 0; i < offsets.size(); ++i) {
    check_window(files.empty() ? 0 : files[i], offsets[i], length);
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
    if (!batches_.empty()) {
      throw InputError("", 0,
                       "batches in flight belong to the thread that submitted them (" + paths_[0] +
                           "): wait for them there first");
    }
    // Another thread: the ring refuses it (single issuer). Nothing is in
    // flight here (mutex_ is held), so a new ring for this thread is safe.
    batch_queue_.reset();
    backend_.reset();
  }
  if (fork_generation_ != 0 && generation != fork_generation_) {
    // First use in a forked child: the parent's pool is not mapped here
    // (MADV_DONTFORK) and its threads do not exist; leave them be.
    drop_batches();
    (void)pool_.release();
    (void)backend_.release();
    stats_ = {};
  }
  fork_generation_ = generation;
  pool_ = std::make_unique<BufferPool>();
  int rc = pool_->init(kSlotSize, depth_);
  if (rc < 0) throw SysError(-rc, "map bounce buffers");
  std::vector<int> fds;
  for (const DirectFile& file : files_) fds.push_back(file.fd);
  backend_ = choose_backend(choice_, fds, depth_, pool_.get(), &backend_note_);
  backend_thread_ = std::this_thread::get_id();
}

DirectReader::Span DirectReader::span_for(const DirectFile& file, uint64_t offset,
                                          uint64_t length) {
  Span span;
  const uint64_t start = align_down(offset, file.offset_align);
  span.buffer = OwnedBlock(length == 0 ? 0 : align_up(offset + length, file.offset_align) - start);
  span.head = offset - start;
  return span;
}

void DirectReader::plan(const DirectFile& file, uint32_t index, uint64_t offset, uint64_t length,
                        uint8_t* dst, bool dst_is_span, PieceQueue* queue) {
  const uint64_t align = file.offset_align;
  const uint64_t start = align_down(offset, align);
  const uint64_t end = align_up(offset + length, align);
  // Straight into the caller's memory when the kernel can DMA there as asked.
  const bool direct_ok = dst_is_span || (start == offset && end == offset + length &&
                                         is_aligned(dst, file.memory_align));
  const uint64_t step = direct_ok ? kMaxIo : kSlotSize;
  for (uint64_t at = start; at < end; at += step) {
    Piece piece;
    piece.file = index;
    piece.offset = at;
    piece.length = static_cast<uint32_t>(std::min(step, end - at));
    piece.want_lo = std::max(at, offset);
    piece.want_hi = std::min(at + piece.length, offset + length);
    if (direct_ok) {
      piece.io = dst + (at - (dst_is_span ? start : offset));
    } else {
      piece.copy_to = dst + (piece.want_lo - offset);
    }
    queue->push(piece);
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
  Span span = span_for(files_[file], offset, length);
  if (span.buffer.data() == nullptr)
    throw SysError(ENOMEM, "allocate a buffer to read", paths_[file]);
  if (length == 0) return span;
  ensure_backend();
  settle_batches();
  PieceQueue queue(backend_.get(), pool_.get(), &paths_, &stats_);
  plan(files_[file], file, offset, length, span.buffer.data(), true, &queue);
  queue.wait_all();
  span.length = contiguous_bytes(queue, queue.size());
  ++stats_.reads;
  stats_.bytes += span.length;
  return span;
}

size_t DirectReader::read_into(uint8_t* dst, size_t length, uint64_t offset, uint32_t file) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_open(file);
  check_range(offset, length);
  if (length == 0) return 0;
  ensure_backend();
  settle_batches();
  PieceQueue queue(backend_.get(), pool_.get(), &paths_, &stats_);
  plan(files_[file], file, offset, length, dst, false, &queue);
  queue.wait_all();
  size_t total = contiguous_bytes(queue, queue.size());
  ++stats_.reads;
  stats_.bytes += total;
  return total;
}

OwnedBlock DirectReader::read_batch(const std::vector<uint64_t>& offsets, size_t length,
                                    const std::vector<uint32_t>& files) {
  {
    // The windows first: a window past the end is a ValueError, never an
    // allocation of what it claims (read_batch([0], 2**62) of an 8 KiB file).
    std::lock_guard<std::mutex> lock(mutex_);
    check_rows(offsets, length, files);
  }
  OwnedBlock out = batch_memory(offsets.size(), length);
  read_batch_into(offsets, length, out.data(), files);
  return out;
}

OwnedBlock DirectReader::batch_memory(size_t rows, size_t length) {
  if (length != 0 && rows > SIZE_MAX / length) {
    throw InputError("", 0, "offsets x length overflows");
  }
  OwnedBlock out(rows * length);
  if (out.data() == nullptr) throw SysError(ENOMEM, "allocate a batch buffer");
  return out;
}

uint64_t DirectReader::plan_rows(const std::vector<uint64_t>& offsets, size_t length, uint8_t* dst,
                                 const std::vector<uint32_t>& files, PieceQueue* queue) {
  uint64_t from_cache = 0;
  for (size_t i = 0; i < offsets.size() && length > 0; ++i) {
    const uint32_t file = files.empty() ? 0u : files[i];
    uint8_t* row = dst + i * length;
    if (page_cache_ && resident_[file].copy_if_resident(offsets[i], length, row)) {
      ++from_cache;
      continue;
    }
    plan(files_[file], file, offsets[i], length, row, false, queue);
  }
  return from_cache;
}

void DirectReader::read_batch_into(const std::vector<uint64_t>& offsets, size_t length,
                                   uint8_t* dst, const std::vector<uint32_t>& files) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_rows(offsets, length, files);
  if (length == 0 || offsets.empty()) return;
  ensure_backend();
  settle_batches();
  PieceQueue queue(backend_.get(), pool_.get(), &paths_, &stats_);
  const uint64_t from_cache = plan_rows(offsets, length, dst, files, &queue);
  queue.wait_all();
  for (size_t i = 0; i < queue.size(); ++i) {
    // Checked against the size above: the file shrank while we read.
    const Piece& piece = queue.front(i);
    if (piece.delivered < piece.want_hi - piece.want_lo) {
      throw SysError(ENODATA, "read (the file shrank since it was opened)", paths_[piece.file]);
    }
  }
  stats_.reads += offsets.size();
  stats_.bytes += offsets.size() * length;
  stats_.page_cache_reads += from_cache;
}

void DirectReader::settle_batches() {
  if (batch_queue_ && batch_queue_->in_flight() > 0) {
    try {
      batch_queue_->wait_all();
    } catch (const SysError&) {
      batches_.clear();  // the queue is empty now; the failure is this call's to say
      throw;
    }
  }
}

void DirectReader::drop_batches() {
  // The parent's ring and bounce slots are not this process's: nothing to wait on.
  if (batch_queue_) (void)batch_queue_.release();
  batches_.clear();
}

uint64_t DirectReader::submit_batch(const std::vector<uint64_t>& offsets, size_t length,
                                    const std::vector<uint32_t>& files) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_rows(offsets, length, files);
  OwnedBlock rows = batch_memory(offsets.size(), length);
  ensure_backend();
  if (!batch_queue_)
    batch_queue_ = std::make_unique<PieceQueue>(backend_.get(), pool_.get(), &paths_, &stats_);
  PendingBatch batch;
  batch.ticket = next_ticket_++;
  batch.count = offsets.size();
  batch.length = length;
  batch.rows = std::move(rows);
  const size_t before = batch_queue_->size();
  batch.from_cache = plan_rows(offsets, length, batch.rows.data(), files, batch_queue_.get());
  batch.pieces = batch_queue_->size() - before;
  const uint64_t ticket = batch.ticket;
  batches_.push_back(std::move(batch));
  batch_queue_->advance();
  return ticket;
}

OwnedBlock DirectReader::wait_batch(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_open(0);
  ensure_backend();  // a forked child forgets the parent's batches here
  if (batches_.empty() || batches_.front().ticket != ticket) {
    bool pending = std::any_of(batches_.begin(), batches_.end(),
                               [&](const PendingBatch& b) { return b.ticket == ticket; });
    throw InputError("", 0,
                     pending ? "wait for batches in the order they were submitted"
                             : "no such batch in flight (waited for already, or the reader "
                               "was closed or forked since)");
  }
  PendingBatch& batch = batches_.front();
  try {
    batch_queue_->wait_for_first(batch.pieces);
  } catch (const SysError&) {
    batches_.clear();  // the failure ended every batch's reads
    throw;
  }
  for (size_t i = 0; i < batch.pieces; ++i) {
    const Piece& piece = batch_queue_->front(i);
    if (piece.delivered < piece.want_hi - piece.want_lo) {
      batch_queue_->pop_front(batch.pieces);
      batches_.pop_front();
      throw SysError(ENODATA, "read (the file shrank since it was opened)", paths_[piece.file]);
    }
  }
  batch_queue_->pop_front(batch.pieces);
  stats_.reads += batch.count;
  stats_.bytes += batch.count * batch.length;
  stats_.page_cache_reads += batch.from_cache;
  OwnedBlock rows = std::move(batch.rows);
  batches_.pop_front();
  batch_queue_->advance();
  return rows;
}

size_t DirectReader::batches_pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return batches_.size();
}

void ReaderStats::add(const ReaderStats& other) {
  ios += other.ios;
  fixed_ios += other.fixed_ios;
  io_latency.merge(other.io_latency);
  reads += other.reads;
  bytes += other.bytes;
  page_cache_reads += other.page_cache_reads;
}

ReaderStats DirectReader::stats() const {
  ReaderStats total;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    total = stats_;
  }
  std::lock_guard<std::mutex> lock(stream_totals_->mutex);
  total.add(stream_totals_->stats);
  return total;
}

std::unique_ptr<DirectReader::Stream> DirectReader::stream(std::vector<uint64_t> offsets,
                                                           size_t length,
                                                           std::vector<uint32_t> files,
                                                           size_t batch, int64_t depth) {
  check_depth(depth, "depth");
  std::lock_guard<std::mutex> lock(mutex_);
  check_rows(offsets, length, files);
  if (batch != 0 && length != 0 && batch > SIZE_MAX / length) {
    throw InputError("", 0, "batch x length overflows");
  }
  return std::unique_ptr<Stream>(new Stream(*this, std::move(offsets), length, std::move(files),
                                            batch, static_cast<unsigned>(depth)));
}

DirectReader::Stream::Stream(const DirectReader& reader, std::vector<uint64_t> offsets,
                             size_t length, std::vector<uint32_t> files, size_t batch,
                             unsigned depth)
    : paths_(reader.paths_),
      offsets_(std::move(offsets)),
      file_of_(std::move(files)),
      length_(length),
      batch_(batch),
      depth_(depth),
      fork_generation_(g_fork_generation.load()),
      thread_(std::this_thread::get_id()),
      totals_(reader.stream_totals_) {
  try {
    for (size_t i = 0; i < reader.files_.size(); ++i) {
      DirectFile file = reader.files_[i];
      if ((file.fd = fcntl(file.fd, F_DUPFD_CLOEXEC, 0)) < 0) {
        throw SysError(errno, "dup", paths_[i]);
      }
      files_.push_back(file);
      if (reader.page_cache_) {
        ResidentMap map;
        if (int rc = map.open_like(reader.resident_[i]); rc < 0) {
          throw SysError(-rc, "map", paths_[i]);
        }
        resident_.push_back(std::move(map));
      }
    }
    int rc = bounce_.init(kSlotSize, depth_);
    if (rc < 0) throw SysError(-rc, "map bounce buffers");
    std::vector<int> fds;
    for (const DirectFile& file : files_) fds.push_back(file.fd);
    // The reader's choice, as it turned out: a reader that fell back to the
    // pool does not try io_uring again for its streams.
    bool pread = std::string(reader.backend_ ? reader.backend_->name() : "") == "pread";
    backend_ = choose_backend(pread ? BackendChoice::Pread : reader.choice_, fds, depth_, &bounce_,
                              &backend_note_);
    queue_ = std::make_unique<PieceQueue>(backend_.get(), &bounce_, &paths_, &stats_);
    plan_ahead();
  } catch (...) {
    close_locked();
    throw;
  }
}

DirectReader::Stream::~Stream() { close(); }

void DirectReader::Stream::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  close_locked();
}

void DirectReader::Stream::close_locked() {
  bool forked = fork_generation_ != g_fork_generation.load();
  bool settled = true;
  if (queue_ && !forked) {
    settled = queue_->drain();  // every read counted before the totals take them
    std::lock_guard<std::mutex> lock(totals_->mutex);
    totals_->stats.add(stats_);
  }
  if (forked || !settled) {
    // Forked: the ring and the bounce slots are the parent's. Unsettled (a
    // stream dropped in a thread other than its ring's): reads are still in
    // flight, so their memory and the ring are left to them, never reused.
    (void)queue_.release();
    (void)backend_.release();
    bounce_.abandon();
    if (!settled) {
      for (Unit& unit : units_) (void)unit.block.take();
    }
  }
  queue_.reset();
  units_.clear();
  backend_.reset();
  resident_.clear();
  for (DirectFile& file : files_) close_direct(&file);
  files_.clear();
}

bool DirectReader::Stream::closed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !queue_;
}

size_t DirectReader::Stream::remaining() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return offsets_.size() - returned_rows_;
}

std::string DirectReader::Stream::backend() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return backend_ ? backend_->name() : "closed";
}

ReaderStats DirectReader::Stream::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

// Plans rows ahead: always the front unit, at least twice the depth in IOs,
// and up to eight times it while the rows ahead take under 64 MiB. Rows
// complete out of order and are returned in order: a slow read at the front
// must not leave the ring idle for want of planned reads behind it. A row
// copied from the page cache counts as the reads it would have taken: it adds
// none to the queue, and a stream of cached rows once copied all of them (119
// MB of a data set) before its first row came back.
void DirectReader::Stream::plan_ahead() {
  const size_t rows_per_unit = batch_ == 0 ? 1 : batch_;
  const size_t reads_per_row = std::max<size_t>(1, (length_ + kMaxIo - 1) / kMaxIo);
  auto room = [&] {
    const size_t ahead = queue_->size() + copied_reads_;
    if (units_.empty() || ahead < 2 * depth_) return true;
    return ahead < 8 * depth_ && planned_bytes_ < kLookaheadBytes;
  };
  while (planned_rows_ < offsets_.size() && room()) {
    size_t rows = std::min(rows_per_unit, offsets_.size() - planned_rows_);
    Unit unit;
    size_t before = queue_->size();
    if (batch_ == 0) {
      const DirectFile& file = files_[file_of_.empty() ? 0 : file_of_[planned_rows_]];
      Span span = span_for(file, offsets_[planned_rows_], length_);
      unit.block = std::move(span.buffer);
      unit.head = span.head;
    } else {
      unit.block = OwnedBlock(rows * length_);
    }
    if (unit.block.data() == nullptr) throw SysError(ENOMEM, "allocate a stream buffer");
    for (size_t row = 0; row < rows && length_ > 0; ++row) {
      size_t index = planned_rows_ + row;
      uint32_t file = file_of_.empty() ? 0 : file_of_[index];
      uint8_t* dst = unit.block.data() + (batch_ == 0 ? 0 : row * length_);
      if (!resident_.empty() &&
          resident_[file].copy_if_resident(offsets_[index], length_,
                                           dst + (batch_ == 0 ? unit.head : 0))) {
        ++stats_.page_cache_reads;
        unit.copied_reads += reads_per_row;
        continue;
      }
      DirectReader::plan(files_[file], file, offsets_[index], length_, dst, batch_ == 0,
                         queue_.get());
    }
    unit.rows = rows;
    unit.pieces = queue_->size() - before;
    copied_reads_ += unit.copied_reads;
    planned_rows_ += rows;
    planned_bytes_ += unit.block.size();
    units_.push_back(std::move(unit));
  }
}

bool DirectReader::Stream::next(Item* item) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!queue_) throw InputError("", 0, "next() on a closed stream (" + paths_[0] + ")");
  if (fork_generation_ != g_fork_generation.load()) {
    throw InputError("", 0, "a stream belongs to the process that made it: make one after fork");
  }
  if (backend_->single_thread() && thread_ != std::this_thread::get_id()) {
    throw InputError("", 0, "an io_uring stream belongs to the thread that made it");
  }
  if (units_.empty()) return false;
  Unit& unit = units_.front();
  try {
    queue_->wait_for_first(unit.pieces);
    for (size_t i = 0; i < unit.pieces; ++i) {
      const Piece& piece = queue_->front(i);
      if (piece.delivered < piece.want_hi - piece.want_lo) {
        throw SysError(ENODATA, "read (the file shrank since it was opened)", paths_[piece.file]);
      }
    }
    queue_->pop_front(unit.pieces);
    copied_reads_ -= unit.copied_reads;
    planned_bytes_ -= unit.block.size();
    item->block = std::move(unit.block);
    item->head = unit.head;
    item->rows = unit.rows;
    units_.pop_front();
    returned_rows_ += item->rows;
    stats_.reads += item->rows;
    stats_.bytes += item->rows * length_;
    plan_ahead();
    queue_->advance();
  } catch (...) {
    close_locked();
    throw;
  }
  return true;
}

}  // namespace pod_init
