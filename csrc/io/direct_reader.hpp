// The O_DIRECT reader: reads of any offset and length from one or more files
// or raw block devices (the shards of a data set: one batch may touch many),
// served by aligned reads (straight into the caller's memory when it
// is aligned, else through bounce slots), with a deep queue on io_uring or a
// pread pool. Rings, pools and threads belong to one process: a forked child
// builds its own on first use. An io_uring ring serves one thread at a time: a
// call from another thread builds a new one.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "io/aligned_buffer.hpp"
#include "io/io_choice.hpp"
#include "io/io_memory.hpp"

namespace pod_init {

// Defined in detail/: a user of the reader needs only their names.
struct DirectFile;
class IoBackend;
class PieceQueue;
class ResidentMap;

// IoCounters: the reads issued to the kernel, how many went through
// registered memory, and their latency (submit to completion).
struct ReaderStats : IoCounters {
  uint64_t reads = 0;  // requests: one per read()/read_into(), one per batch or stream row
  uint64_t bytes = 0;  // bytes handed to the caller
  uint64_t page_cache_reads = 0;  // requests copied from resident pages instead

  void add(const ReaderStats& other);
};

inline constexpr int64_t kMaxQueueDepth = 4096;

class DirectReader {
 public:
  static constexpr uint32_t kMaxIo = 1 << 20;       // largest single read issued
  static constexpr uint32_t kSlotSize = 128 << 10;  // one bounce slot
  static constexpr uint64_t kLargeRead = 64 << 20;  // read() checks the size above this

  // Opens every path and sets up the backend in this process. Throws SysError
  // (with the path) when a file or the chosen backend cannot be used and
  // InputError for no paths or a queue depth outside 1..4096. With
  // `page_cache`, batch rows whose pages are all resident are copied from
  // the page cache (see ResidentMap) and only the rest are read directly.
  // queue_depth: 1 to kMaxQueueDepth, else InputError (the reader owns the check).
  DirectReader(std::vector<std::string> paths, int64_t queue_depth, BackendChoice backend,
               bool page_cache = false);
  DirectReader(std::string path, int64_t queue_depth, BackendChoice backend)
      : DirectReader(std::vector<std::string>{std::move(path)}, queue_depth, backend) {}
  ~DirectReader();
  DirectReader(const DirectReader&) = delete;
  DirectReader& operator=(const DirectReader&) = delete;

  size_t file_count() const { return paths_.size(); }
  const std::string& path(size_t file = 0) const { return paths_.at(file); }
  uint64_t size(size_t file = 0) const;  // at open
  // The strictest alignment over the files: what a caller must meet for all.
  uint32_t block_size() const;
  uint32_t memory_alignment() const;
  bool direct() const;  // every file takes O_DIRECT
  bool page_cache() const { return page_cache_; }
  unsigned queue_depth() const { return depth_; }
  std::string backend() const;
  // Why auto chose pread, or what io_uring runs without; "" when nothing to say.
  std::string backend_note() const;

  // Blocks come from IoMemory: reused, already faulted in, registered with the ring.
  struct Span {
    OwnedBlock buffer;  // the aligned superset that was read
    size_t head = 0;    // where the requested bytes start in it
    size_t length = 0;  // how many of them there are (short at end of file)
  };
  Span read(uint64_t offset, uint64_t length, uint32_t file = 0);
  // Reads length bytes at offset into dst; returns the bytes read (short at end of file).
  size_t read_into(uint8_t* dst, size_t length, uint64_t offset, uint32_t file = 0);
  // Row i holds the length bytes at offsets[i] of file files[i] (of file 0 when
  // `files` is empty); every window must lie inside its file.
  OwnedBlock read_batch(const std::vector<uint64_t>& offsets, size_t length,
                        const std::vector<uint32_t>& files = {});
  // The same into the caller's rows (offsets.size() x length bytes at dst), so a
  // loop can reuse one buffer (pinned memory, say) instead of faulting in new pages.
  void read_batch_into(const std::vector<uint64_t>& offsets, size_t length, uint8_t* dst,
                       const std::vector<uint32_t>& files = {});

  // Batches read asynchronously: submit_batch() queues a batch's reads behind
  // those of the batches before it and returns a ticket at once;
  // wait_batch(ticket) returns that batch's rows (as read_batch's) once they
  // have arrived. Batches come back in the order they were submitted (waiting
  // for a later one first is an InputError), so a loader that submits the next
  // batch before waiting for this one keeps the queue full between calls,
  // where read_batch back to back lets it drain at the end of every batch.
  // The other calls first let the batches in flight arrive (they stay to be
  // waited for); close() drops them. They belong to the thread that submitted
  // them when the backend is a single-issuer ring.
  uint64_t submit_batch(const std::vector<uint64_t>& offsets, size_t length,
                        const std::vector<uint32_t>& files = {});
  OwnedBlock wait_batch(uint64_t ticket);
  size_t batches_pending() const;

  class Stream;
  // Rows (batch == 0) or batches of `batch` rows, in order, with `depth` reads
  // kept in flight between calls; windows are checked here, as read_batch's.
  std::unique_ptr<Stream> stream(std::vector<uint64_t> offsets, size_t length,
                                 std::vector<uint32_t> files, size_t batch, int64_t depth);

  // The reader's own reads and those of its streams that have closed.
  ReaderStats stats() const;
  void close();
  bool closed() const;

 private:
  void check_open(uint32_t file) const;
  static void check_range(uint64_t offset, uint64_t length);
  void check_window(uint32_t file, uint64_t offset, uint64_t length);
  static void check_depth(int64_t depth, const char* what);
  // Every row's window lies in its file (call with mutex_ held).
  void check_rows(const std::vector<uint64_t>& offsets, uint64_t length,
                  const std::vector<uint32_t>& files);
  void ensure_backend();  // call with mutex_ held
  // Lets the submitted batches' reads arrive before another call uses the
  // backend (call with mutex_ held, after ensure_backend).
  void settle_batches();
  // Memory for `rows` rows of `length` bytes (InputError when it overflows).
  static OwnedBlock batch_memory(size_t rows, size_t length);
  // Plans row i of offsets into dst + i * length (copied from the page cache
  // where page_cache_ allows: call with mutex_ held); returns how many were.
  uint64_t plan_rows(const std::vector<uint64_t>& offsets, size_t length, uint8_t* dst,
                     const std::vector<uint32_t>& files, PieceQueue* queue);
  // Forgets the batches (a forked child's, or at close): their memory stays.
  void drop_batches();
  // The aligned superset of [offset, offset + length) in `file`, allocated
  // (buffer.data() is nullptr when it cannot be), with head set and length 0.
  static Span span_for(const DirectFile& file, uint64_t offset, uint64_t length);
  // The IOs that read [offset, offset + length) of `file` to dst: straight
  // into it when it can take them (dst_is_span: dst is the aligned superset),
  // else through bounce slots.
  static void plan(const DirectFile& file, uint32_t index, uint64_t offset, uint64_t length,
                   uint8_t* dst, bool dst_is_span, PieceQueue* queue);
  // The wanted bytes of the first `count` pieces up to the first short one (the end of the file).
  static uint64_t contiguous_bytes(const PieceQueue& queue, size_t count);

  std::vector<std::string> paths_;
  unsigned depth_;
  BackendChoice choice_;
  bool page_cache_;
  std::vector<DirectFile> files_;
  std::vector<ResidentMap> resident_;  // one per file, with page_cache_
  mutable std::mutex mutex_;
  uint64_t fork_generation_ = 0;  // the process generation the members below belong to
  std::unique_ptr<BufferPool> pool_;
  std::unique_ptr<IoBackend> backend_;
  std::thread::id backend_thread_;  // the thread that made backend_
  std::string backend_note_;
  ReaderStats stats_;
  struct PendingBatch {
    uint64_t ticket = 0;
    OwnedBlock rows;
    size_t count = 0;   // rows
    size_t length = 0;  // bytes per row
    size_t pieces = 0;  // of batch_queue_'s, in order
    uint64_t from_cache = 0;
  };
  std::unique_ptr<PieceQueue> batch_queue_;  // on backend_
  std::deque<PendingBatch> batches_;
  uint64_t next_ticket_ = 1;
  // Where streams leave their counts when they close: shared, since a stream
  // may outlive its reader.
  struct StreamTotals {
    std::mutex mutex;
    ReaderStats stats;
  };
  std::shared_ptr<StreamTotals> stream_totals_ = std::make_shared<StreamTotals>();
};

// A stream owns duplicates of the reader's descriptors, its own ring and
// bounce slots, and the blocks of the rows ahead: closing the reader leaves it
// working, and dropping it waits for its reads in flight. It belongs to the
// process and (with io_uring) the thread that made it.
class DirectReader::Stream {
 public:
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  struct Item {
    OwnedBlock block;
    size_t head = 0;  // where the first row starts in block
    size_t rows = 0;  // 1 per row without batches
  };
  // The next row or batch; false at the end. Throws SysError for a failed read
  // (the stream is then closed) and InputError when closed or used from
  // another process or thread.
  bool next(Item* item);
  void close();  // waits for the reads in flight
  bool closed() const;
  size_t length() const { return length_; }
  size_t batch() const { return batch_; }
  size_t remaining() const;  // rows not yet returned
  unsigned depth() const { return depth_; }
  std::string backend() const;
  // Why the stream's thread fell back to pread (as the reader's note); "" when it did not.
  const std::string& backend_note() const { return backend_note_; }
  ReaderStats stats() const;

 private:
  friend class DirectReader;
  Stream(const DirectReader& reader, std::vector<uint64_t> offsets, size_t length,
         std::vector<uint32_t> files, size_t batch, unsigned depth);
  void plan_ahead();  // call with mutex_ held
  void close_locked();

  struct Unit {
    OwnedBlock block;
    size_t head = 0;
    size_t rows = 0;
    size_t pieces = 0;        // of the queue's, in order
    size_t copied_reads = 0;  // the reads its rows copied from the page cache took the place of
  };

  std::vector<std::string> paths_;
  std::vector<DirectFile> files_;      // duplicated descriptors
  std::vector<ResidentMap> resident_;  // with the reader's page_cache
  std::vector<uint64_t> offsets_;
  std::vector<uint32_t> file_of_;
  size_t length_;
  size_t batch_;
  unsigned depth_;
  uint64_t fork_generation_;
  std::thread::id thread_;
  mutable std::mutex mutex_;
  BufferPool bounce_;
  std::unique_ptr<IoBackend> backend_;
  std::string backend_note_;
  std::unique_ptr<PieceQueue> queue_;
  std::deque<Unit> units_;  // planned, in order
  static constexpr size_t kLookaheadBytes = 64 << 20;
  size_t planned_rows_ = 0;
  size_t planned_bytes_ = 0;  // in the blocks of the planned units
  size_t copied_reads_ = 0;   // what the planned units' Unit::copied_reads add up to
  size_t returned_rows_ = 0;
  ReaderStats stats_;
  std::shared_ptr<StreamTotals> totals_;  // the reader's
};

}  // namespace pod_init
