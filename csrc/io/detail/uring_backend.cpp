#include <liburing.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "common/clock.hpp"
#include "common/error.hpp"
#include "io/detail/io_backend.hpp"
#include "io/io_memory.hpp"

namespace pod_init {

namespace {

class UringBackend : public IoBackend {
 public:
  UringBackend(unsigned depth, std::vector<int> fds)
      : depth_(depth),
        fds_(std::move(fds)),
        poll_ns_(sysconf(_SC_NPROCESSORS_ONLN) >= kPollFromCpus ? kPollNs : 0) {}
  ~UringBackend() override {
    if (!ready_) return;
    // The ring itself is torn down asynchronously; unregistering first drops its
    // hold on the file and the pinned pool now, so a umount right after close works.
    if (fixed_file_) io_uring_unregister_files(&ring_);
    if (pool_ != nullptr || table_) io_uring_unregister_buffers(&ring_);
    io_uring_queue_exit(&ring_);
  }

  int init(const BufferPool* pool) {
    // Completions are handled only when this thread asks for them (no
    // interrupting the task, no IPIs: dear in a VM), which needs a ring used by
    // one thread; kernels before 6.1 (DEFER_TASKRUN) or 5.19 (COOP_TASKRUN) refuse
    // the flags with EINVAL, and the plain ring follows.
    const unsigned attempts[] = {
        IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_COOP_TASKRUN,
        IORING_SETUP_COOP_TASKRUN, 0};
    int rc = -EINVAL;
    for (unsigned flags : attempts) {
      io_uring_params params{};
      params.flags = flags;
      rc = io_uring_queue_init_params(depth_, &ring_, &params);
      if (rc != -EINVAL) {
        single_issuer_ = (flags & IORING_SETUP_SINGLE_ISSUER) != 0;
        break;
      }
    }
    if (rc < 0) return rc;
    ready_ = true;
    // Registration saves the kernel a file lookup and a page pinning per IO;
    // IO works without it, so a refusal is only noted.
    if ((rc = io_uring_register_files(&ring_, fds_.data(), static_cast<unsigned>(fds_.size()))) ==
        0) {
      fixed_file_ = true;
    } else {
      note_ += "files not registered (" + errno_name(-rc) + ") ";
    }
    // A sparse table (Linux 5.19) whose slots follow IoMemory's regions; slot
    // 0 holds the bounce slots. An older kernel gets the bounce slots alone.
    retired_seen_ = IoMemory::instance().retired_count();
    if ((rc = io_uring_register_buffers_sparse(&ring_, kTableSlots)) == 0) {
      table_ = true;
      for (unsigned slot = kTableSlots; slot-- > 1;) free_slots_.push_back(slot);
    }
    if (pool != nullptr && pool->base() != nullptr) {
      iovec region{pool->base(), pool->bytes()};
      rc = table_ ? io_uring_register_buffers_update_tag(&ring_, 0, &region, nullptr, 1)
                  : io_uring_register_buffers(&ring_, &region, 1);
      if (rc >= 0) {
        pool_ = pool;
      } else {
        note_ += "buffers not registered (" + errno_name(-rc) + ", see RLIMIT_MEMLOCK) ";
      }
    }
    if (!table_) note_ += "no registration of reader-owned memory (needs Linux 5.19) ";
    if (!note_.empty()) note_.pop_back();
    return 0;
  }

  const char* name() const override { return "io_uring"; }
  bool single_thread() const override { return single_issuer_; }
  std::string note() const override { return note_; }
  unsigned depth() const override { return depth_; }

  int submit(const IoRequest& request) override {
    int index = fixed_index(request.buffer, request.length);
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {
      int rc = io_uring_submit(&ring_);
      if (rc < 0) return rc;
      unsubmitted_ = 0;
      if ((sqe = io_uring_get_sqe(&ring_)) == nullptr) return -EBUSY;
    }
    int fd = fixed_file_ ? static_cast<int>(request.file) : fds_[request.file];
    if (index >= 0 && request.write) {
      io_uring_prep_write_fixed(sqe, fd, request.buffer, request.length, request.offset, index);
    } else if (index >= 0) {
      io_uring_prep_read_fixed(sqe, fd, request.buffer, request.length, request.offset, index);
    } else if (request.write) {
      io_uring_prep_write(sqe, fd, request.buffer, request.length, request.offset);
    } else {
      io_uring_prep_read(sqe, fd, request.buffer, request.length, request.offset);
    }
    if (fixed_file_) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(sqe, request.tag);
    ++unsubmitted_;
    ++outstanding_;
    // While other IOs are in flight, each goes to the kernel as it is queued,
    // as fio's does: handed over in groups, a refilled depth reaches the
    // device as a burst, each request waits behind the ones dispatched before
    // it, their completions come back in a burst, and the next refill is one
    // again. On a virtio disk, 4 KiB reads at depth 32 went from 0.80-0.85x
    // fio's IOPS to 1.02-1.08x for one system call per IO. The first IO waits
    // for the next call, which is the wait itself when it is the only one
    // (a read at depth 1: one system call, not two). A refusal here (the
    // kernel short of memory) leaves the IO queued for the next call.
    if (outstanding_ > 1) {
      int rc = io_uring_submit(&ring_);
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) return rc;
      if (rc >= 0) unsubmitted_ = 0;
    }
    return index >= 0 ? 1 : 0;
  }

  int reap(std::vector<IoCompletion>* completions) override {
    // Completions already there are taken without a system call.
    if (unsubmitted_ == 0) {
      if (int count = drain(completions); count > 0) return count;
    }
    // With CPUs to spare, a lone read polls a while before sleeping: a sleep
    // and its wake-up cost more than a fast read takes (on the 16-CPU H200
    // machine, QD1 went from 1.04-1.16x fio's latency to 0.88-0.96x). With
    // more in flight the next completion is near anyway, and four readers at
    // depth 32 that polled reached 0.89-0.97x of fio's four jobs, against
    // 0.93-1.03x sleeping as fio does. On two CPUs the poll takes the CPU the
    // completion path needs: never there.
    if (poll_ns_ > 0 && outstanding_ == 1) {
      uint64_t deadline = monotonic_ns() + poll_ns_;
      do {
        int rc =
            unsubmitted_ > 0 ? io_uring_submit_and_get_events(&ring_) : io_uring_get_events(&ring_);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) return rc;
        if (rc >= 0) unsubmitted_ = 0;
        if (int count = drain(completions); count > 0) return count;
      } while (monotonic_ns() < deadline);
    }
    int rc;
    do {
      rc = io_uring_submit_and_wait(&ring_, 1);
    } while (rc == -EINTR);
    if (rc < 0) return rc;
    unsubmitted_ = 0;
    return drain(completions);
  }

  int poll(std::vector<IoCompletion>* completions) override {
    // One system call submits what is queued and, with DEFER_TASKRUN, posts
    // the completions the kernel holds back until the ring's thread asks.
    int rc = io_uring_submit_and_get_events(&ring_);
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) return rc;
    if (rc >= 0) unsubmitted_ = 0;
    return drain(completions);
  }

 private:
  static constexpr unsigned kTableSlots = 1024;
  static constexpr uint64_t kPollNs = 100'000;
  static constexpr long kPollFromCpus = 4;

  // The registered buffer [buffer, buffer + length) lies in, registering its
  // region on first use; -1 for memory that is not ours (the caller's), or
  // when the table is full or registration was refused.
  int fixed_index(const uint8_t* buffer, uint32_t length) {
    if (pool_ != nullptr && pool_->contains(buffer)) return 0;
    if (!table_) return -1;
    IoMemory& memory = IoMemory::instance();
    if (memory.retired_count() != retired_seen_) forget_retired();
    if (last_.id != 0 && buffer >= last_.base && buffer + length <= last_.base + last_.bytes) {
      return last_slot_;
    }
    IoRegion region;
    if (!memory.find(buffer, length, &region)) return -1;
    auto known = slots_.find(region.id);
    if (known == slots_.end()) {
      // A block of its own may take one IO and be unmapped: pinning it whole
      // would cost what that IO's own pinning does, so wait for its second IO.
      if (!region.arena && seen_once_.insert(region.id).second) return -1;
      if (free_slots_.empty() || registration_refused_) return -1;
      unsigned slot = free_slots_.back();
      iovec span{region.base, region.bytes};
      int rc = io_uring_register_buffers_update_tag(&ring_, slot, &span, nullptr, 1);
      if (rc < 0) {
        registration_refused_ = true;
        note_ += std::string(note_.empty() ? "" : " ") + "memory not registered (" +
                 errno_name(-rc) + ", see RLIMIT_MEMLOCK)";
        return -1;
      }
      free_slots_.pop_back();
      seen_once_.erase(region.id);
      known = slots_.emplace(region.id, slot).first;
    }
    last_ = region;
    last_slot_ = static_cast<int>(known->second);
    return last_slot_;
  }

  // Drops the registrations of retired regions, so their pages are unpinned
  // and no IO can reach them; reads of memory mapped at the same addresses
  // later find new regions.
  void forget_retired() {
    IoMemory& memory = IoMemory::instance();
    uint64_t now = memory.retired_count();
    std::vector<uint64_t> retired;
    if (!memory.retired_since(retired_seen_, &retired)) {
      for (const auto& [id, slot] : slots_) {
        if (!memory.live(id)) retired.push_back(id);
      }
    }
    for (uint64_t id : retired) {
      seen_once_.erase(id);
      auto it = slots_.find(id);
      if (it == slots_.end()) continue;
      iovec empty{nullptr, 0};
      io_uring_register_buffers_update_tag(&ring_, it->second, &empty, nullptr, 1);
      free_slots_.push_back(it->second);
      slots_.erase(it);
    }
    last_ = {};
    retired_seen_ = now;
  }

  int drain(std::vector<IoCompletion>* completions) {
    io_uring_cqe* cqe = nullptr;
    int count = 0;
    while (io_uring_peek_cqe(&ring_, &cqe) == 0) {
      completions->push_back({io_uring_cqe_get_data64(cqe), cqe->res});
      io_uring_cqe_seen(&ring_, cqe);
      ++count;
      --outstanding_;
    }
    return count;
  }

  io_uring ring_{};
  unsigned depth_;
  std::vector<int> fds_;
  uint64_t poll_ns_;
  bool ready_ = false;
  bool fixed_file_ = false;
  bool single_issuer_ = false;
  const BufferPool* pool_ = nullptr;
  bool table_ = false;
  bool registration_refused_ = false;
  std::vector<unsigned> free_slots_;
  std::unordered_map<uint64_t, unsigned> slots_;  // region id -> table slot
  std::unordered_set<uint64_t> seen_once_;        // blocks of their own, not yet registered
  IoRegion last_;                                 // the region of the last lookup
  int last_slot_ = -1;
  uint64_t retired_seen_ = 0;
  unsigned unsubmitted_ = 0;
  unsigned outstanding_ = 0;  // queued or in flight, not yet reaped
  std::string note_;
};

}  // namespace

int make_uring_backend(const std::vector<int>& fds, unsigned depth, const BufferPool* pool,
                       std::unique_ptr<IoBackend>* backend) {
  auto uring = std::make_unique<UringBackend>(depth, fds);
  int rc = uring->init(pool);
  if (rc < 0) return rc;
  *backend = std::move(uring);
  return 0;
}

}  // namespace pod_init
