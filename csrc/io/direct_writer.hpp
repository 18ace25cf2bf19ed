// Crash-safe O_DIRECT writes, for checkpoints: the bytes go to an unnamed file
// in the target's folder (O_TMPFILE; a hidden temporary name where the
// filesystem has none) through staging blocks kept in flight on a ring, then
// the file is synced, named and renamed over the target, and the folder is
// synced. A crash at any point leaves the previous file whole; a full disk is
// an error naming the target, which is untouched. The CRC-32C of the content
// is kept in the file's extended attribute user.pod-init.crc32c (set before
// the sync, so it is there exactly when the content is) and returned.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "io/io_choice.hpp"
#include "io/io_memory.hpp"

namespace pod_init {

// Defined in detail/: a user of the writer needs only their names.
class IoBackend;
class PieceQueue;

inline constexpr const char* kChecksumAttribute = "user.pod-init.crc32c";

class DirectWriter {
 public:
  static constexpr size_t kChunk = 1 << 20;  // one staging block, one write

  static constexpr uint64_t kHeadAlign = 4096;  // what a reserved head is a multiple of

  // expected_size: the final size when known (0: unknown), checked against
  // the free space so a disk without room fails before anything is written.
  // head_bytes: the file's first bytes, left for write_head() (a header that
  // describes what follows, checksums and all); write() starts after them.
  // Throws SysError naming path, InputError for a depth outside 1..4096 or a
  // head that is not a multiple of kHeadAlign.
  DirectWriter(std::string path, uint64_t expected_size, int64_t queue_depth,
               uint64_t head_bytes = 0);
  ~DirectWriter();  // discards an uncommitted file
  DirectWriter(const DirectWriter&) = delete;
  DirectWriter& operator=(const DirectWriter&) = delete;

  // One thread at a time: a call while another thread is inside one is
  // refused with InputError. A writer may change threads (made in one, used
  // in another): the new thread gets a ring of its own, since a ring takes
  // one submitter, while none of the last thread's writes is in flight (the
  // first kChunk bytes are staged, not yet written); a call from another
  // thread while some are is refused too.
  // Appends; returns the CRC-32C of these bytes alone.
  uint32_t write(const uint8_t* data, size_t length);
  // The reserved head, exactly head_bytes of it, once, before commit.
  void write_head(const uint8_t* data, size_t length);
  // Publishes the file under its path; returns the content's CRC-32C.
  uint32_t commit();
  // Drops what was written; the target stays as it was.
  void abort();

  const std::string& path() const { return path_; }
  // The file's size so far: the reserved head, whether written yet or not, and what followed.
  uint64_t bytes() const { return written_; }
  // CRC-32C of the content: with a head reserved, of what follows it until
  // write_head(), of the whole file after.
  uint32_t crc() const { return crc_; }
  bool direct() const { return direct_; }
  bool open() const { return fd_ >= 0; }
  // What the writer worked without ("no O_TMPFILE", "no xattr"...); "" when nothing.
  const std::string& note() const { return note_; }
  IoCounters stats() const { return counters_; }

  // Removes hidden temporaries of `path` left by writers that are no longer
  // running (killed between naming and renaming). Returns how many.
  static int remove_stale_temporaries(const std::string& path);

 private:
  void submit_chunk(size_t length);
  // Queues `block` (padded bytes) for `offset`; takes a staging block back
  // when every one is in flight.
  void submit_block(OwnedBlock block, uint64_t offset, size_t padded);
  void check_open() const;
  // The call's hold on the writer: refused while another thread holds it, or
  // while another thread's writes are in flight on a ring of that thread's.
  std::unique_lock<std::mutex> enter(const char* call);
  void make_backend();
  // What abort() and the destructor do; never throws.
  void discard() noexcept;

  std::string path_;
  std::string folder_;
  std::string name_;
  std::string temp_name_;           // the hidden name, once the file has one
  std::vector<std::string> names_;  // for the queue's errors: the target
  int fd_ = -1;
  int folder_fd_ = -1;
  bool direct_ = false;        // O_DIRECT was taken
  uint32_t offset_align_ = 0;  // what each write is padded to
  uint64_t head_bytes_ = 0;
  bool head_written_ = false;
  uint64_t written_ = 0;
  uint64_t submitted_ = 0;  // file offset of the current staging block
  uint32_t crc_ = 0;
  std::string note_;
  std::unique_ptr<IoBackend> backend_;
  std::unique_ptr<PieceQueue> queue_;
  std::deque<OwnedBlock> in_flight_;  // staging blocks, in the queue's order
  std::vector<OwnedBlock> spare_;
  OwnedBlock current_;
  size_t current_fill_ = 0;
  unsigned depth_;
  IoCounters counters_;
  std::mutex busy_;                 // held for each call
  std::thread::id backend_thread_;  // the thread the ring was made in
};

}  // namespace pod_init
