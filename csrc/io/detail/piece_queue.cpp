#include "io/detail/piece_queue.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "common/clock.hpp"
#include "common/error.hpp"

namespace pod_init {

size_t PieceQueue::submit_more() {
  const size_t before = submitted_;
  while (submitted_ < pieces_.size() && in_flight_ < backend_->depth() && failure_ == 0) {
    Piece& piece = pieces_[submitted_];
    if (piece.io == nullptr && (bounce_ == nullptr || (piece.io = bounce_->acquire()) == nullptr)) {
      break;  // every slot is in flight: the next completion frees one
    }
    piece.submitted_ns = monotonic_ns();
    int rc = backend_->submit(
        {first_tag_ + submitted_, piece.file, piece.io, piece.offset, piece.length, piece.write});
    if (rc < 0) {
      failure_ = rc;
      failed_file_ = piece.file;
      failed_write_ = piece.write;
      break;
    }
    counters_->fixed_ios += static_cast<uint64_t>(rc);
    ++submitted_;
    ++in_flight_;
  }
  return submitted_ - before;
}

void PieceQueue::advance() {
  submit_more();
  if (in_flight_ == 0 || failure_ != 0) return;
  completions_.clear();
  settle(backend_->poll(&completions_));
  // Slots the poll freed take their next IOs now, not at the next wait.
  if (!completions_.empty() && submit_more() > 0) {
    completions_.clear();
    settle(backend_->poll(&completions_));
  }
}

void PieceQueue::reap() {
  completions_.clear();
  settle(backend_->reap(&completions_));
}

void PieceQueue::settle(int rc) {
  if (rc < 0) {
    // The kernel may still use these buffers: nothing safe remains to do.
    throw SysError(-rc, "wait for IO in flight");
  }
  uint64_t done_ns = monotonic_ns();
  for (const IoCompletion& completion : completions_) {
    Piece& piece = pieces_[completion.tag - first_tag_];
    --in_flight_;
    int64_t result = completion.result;
    if ((result == -EAGAIN || result == -EINTR) && failure_ == 0) {
      if (backend_->submit({completion.tag, piece.file, piece.io, piece.offset, piece.length,
                            piece.write}) >= 0) {
        ++in_flight_;
        continue;
      }
    }
    counters_->io_latency.record(done_ns - piece.submitted_ns);
    ++counters_->ios;
    if (piece.write && result >= 0 && result < piece.length) {
      // A short direct write (the device filled up as it ran): the rest is retried
      // once, and a second shortfall names the reason.
      if (result == 0) {
        result = -ENOSPC;
      } else if (failure_ == 0) {
        piece.offset += static_cast<uint64_t>(result);
        piece.io += result;
        piece.length -= static_cast<uint32_t>(result);
        if (backend_->submit(
                {completion.tag, piece.file, piece.io, piece.offset, piece.length, true}) >= 0) {
          ++in_flight_;
          continue;
        }
        result = -ENOSPC;
      }
    }
    if (result < 0 && failure_ == 0) {
      failure_ = result;
      failed_file_ = piece.file;
      failed_write_ = piece.write;
    }
    if (result >= 0 && !piece.write) {
      uint64_t hi = std::min(piece.offset + static_cast<uint64_t>(result), piece.want_hi);
      piece.delivered = hi > piece.want_lo ? hi - piece.want_lo : 0;
    }
    if (piece.copy_to != nullptr) {
      std::memcpy(piece.copy_to, piece.io + (piece.want_lo - piece.offset), piece.delivered);
      bounce_->release(piece.io);
      piece.io = nullptr;
    }
    piece.done = true;
  }
  while (done_prefix_ < pieces_.size() && pieces_[done_prefix_].done) ++done_prefix_;
}

void PieceQueue::wait_for_first(size_t count) {
  while (done_prefix_ < count) {
    submit_more();
    if (in_flight_ == 0) break;
    reap();
  }
  if (failure_ < 0) {
    int64_t failure = failure_;
    drain();
    throw SysError(static_cast<int>(-failure), failed_write_ ? "write" : "read",
                   (*paths_)[failed_file_]);
  }
}

void PieceQueue::pop_front(size_t count) {
  pieces_.erase(pieces_.begin(), pieces_.begin() + static_cast<std::ptrdiff_t>(count));
  first_tag_ += count;
  submitted_ -= count;
  done_prefix_ -= count;
}

bool PieceQueue::drain() noexcept {
  failure_ = failure_ == 0 ? -ECANCELED : failure_;  // submit nothing more
  while (in_flight_ > 0) {
    try {
      reap();
    } catch (const SysError&) {
      break;  // not from this thread, or the ring itself failed
    }
  }
  bool settled = in_flight_ == 0;
  for (Piece& piece : pieces_) {
    bool landed = settled || piece.done;
    if (piece.copy_to != nullptr && piece.io != nullptr && landed) bounce_->release(piece.io);
  }
  first_tag_ += pieces_.size();
  pieces_.clear();
  submitted_ = done_prefix_ = 0;
  failure_ = 0;
  return settled;
}

}  // namespace pod_init
