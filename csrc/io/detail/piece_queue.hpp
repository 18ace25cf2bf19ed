// The IOs of one call, or of a stream that spans many calls: kept in flight
// on a backend up to its depth, in the order they were pushed, with bounce
// slots taken when they are submitted and given back as they complete. The
// reader's calls push a batch and wait for all of it; a stream keeps pushing
// ahead and waits only for the front.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "io/aligned_buffer.hpp"
#include "io/detail/io_backend.hpp"
#include "io/io_choice.hpp"

namespace pod_init {

// One IO: [offset, offset + length) of a file, to or from `io` (the caller's
// memory, or a bounce slot). Of a read, the caller wants [want_lo, want_hi),
// copied to `copy_to` when it went through a slot.
struct Piece {
  uint32_t file = 0;
  uint64_t offset = 0;
  uint32_t length = 0;
  bool write = false;
  uint8_t* io = nullptr;  // nullptr: take a bounce slot when submitting
  uint64_t want_lo = 0, want_hi = 0;
  uint8_t* copy_to = nullptr;
  uint64_t submitted_ns = 0;
  bool done = false;
  uint64_t delivered = 0;  // bytes of [want_lo, want_hi) that arrived
};

class PieceQueue {
 public:
  // `paths` name the backend's files in errors; `bounce` may be null when no
  // piece needs a slot. All must outlive the queue.
  PieceQueue(IoBackend* backend, BufferPool* bounce, const std::vector<std::string>* paths,
             IoCounters* counters)
      : backend_(backend), bounce_(bounce), paths_(paths), counters_(counters) {}
  ~PieceQueue() { (void)drain(); }
  PieceQueue(const PieceQueue&) = delete;
  PieceQueue& operator=(const PieceQueue&) = delete;

  void push(const Piece& piece) { pieces_.push_back(piece); }
  size_t size() const { return pieces_.size(); }
  size_t in_flight() const { return in_flight_; }
  const Piece& front(size_t i) const { return pieces_[i]; }
  // Submits what the depth allows, then waits until the first `count` pieces
  // are done. Throws SysError for a failed IO (after every issued one has
  // come back; the queue is then empty).
  void wait_for_first(size_t count);
  void wait_all() { wait_for_first(pieces_.size()); }
  // Without waiting: takes the completions there are and refills the depth
  // they free, handing every queued IO to the kernel. A stream calls it for
  // each row it returns, so slots freed behind the front of the queue are
  // read into again at once rather than at the next wait (on a virtio disk,
  // 4 KiB at depth 32 went from about 0.75x fio's IOPS to fio's). A failure
  // surfaces in the next wait.
  void advance();
  // Forgets the first `count` pieces, which must be done.
  void pop_front(size_t count);
  // Waits for every submitted IO (their memory may then be freed) and drops
  // the rest. Never throws. False when IOs are still in flight: the backend
  // cannot be waited on from this thread (a single-issuer ring used by another)
  // or failed, and their memory must not be reused.
  bool drain() noexcept;

 private:
  // Prepares IOs up to the depth; returns how many.
  size_t submit_more();
  void reap();  // waits for at least one completion
  // Settles completions_ (from a reap or a poll), whose call returned `rc`.
  void settle(int rc);

  IoBackend* backend_;
  BufferPool* bounce_;
  const std::vector<std::string>* paths_;
  IoCounters* counters_;
  std::deque<Piece> pieces_;
  uint64_t first_tag_ = 0;  // the tag of pieces_.front(): tags count pushes
  size_t submitted_ = 0;    // pieces_[0, submitted_) have been submitted
  size_t done_prefix_ = 0;  // pieces_[0, done_prefix_) are done
  size_t in_flight_ = 0;
  int64_t failure_ = 0;  // the first -errno
  bool failed_write_ = false;
  uint32_t failed_file_ = 0;
  std::vector<IoCompletion> completions_;
};

}  // namespace pod_init
