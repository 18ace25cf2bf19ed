#include <liburing.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "common/clock.hpp"
#include "common/error.hpp"
#include "io/detail/io_backend.hpp"

namespace pod_init {

namespace {

class UringBackend : public IoBackend {
 public:
  UringBackend(unsigned depth, std::vector<int> fds) : depth_(depth), fds_(std::move(fds)) {}
  ~UringBackend() override {
    if (!ready_) return;
    // The ring itself is torn down asynchronously; unregistering first drops its
    // hold on the file and the pinned pool now, so a umount right after close works.
    if (fixed_file_) io_uring_unregister_files(&ring_);
    if (pool_ != nullptr) io_uring_unregister_buffers(&ring_);
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
    // Registration saves the kernel a file lookup and a page pinning per read;
    // reads work without it, so a refusal is only noted.
    if ((rc = io_uring_register_files(&ring_, fds_.data(), static_cast<unsigned>(fds_.size()))) ==
        0) {
      fixed_file_ = true;
    } else {
      note_ += "files not registered (" + errno_name(-rc) + ") ";
    }
    if (pool != nullptr && pool->base() != nullptr) {
      iovec region{pool->base(), pool->bytes()};
      if ((rc = io_uring_register_buffers(&ring_, &region, 1)) == 0) {
        pool_ = pool;
      } else {
        note_ += "buffers not registered (" + errno_name(-rc) + ", see RLIMIT_MEMLOCK) ";
      }
    }
    if (!note_.empty()) note_.pop_back();
    return 0;
  }

  const char* name() const override { return "io_uring"; }
  bool single_thread() const override { return single_issuer_; }
  std::string note() const override { return note_; }
  unsigned depth() const override { return depth_; }

  int submit(const IoRequest& request) override {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {
      int rc = io_uring_submit(&ring_);
      if (rc < 0) return rc;
      unsubmitted_ = 0;
      if ((sqe = io_uring_get_sqe(&ring_)) == nullptr) return -EBUSY;
    }
    int fd = fixed_file_ ? static_cast<int>(request.file) : fds_[request.file];
    if (pool_ != nullptr && pool_->contains(request.buffer)) {
      io_uring_prep_read_fixed(sqe, fd, request.buffer, request.length, request.offset, 0);
    } else {
      io_uring_prep_read(sqe, fd, request.buffer, request.length, request.offset);
    }
    if (fixed_file_) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(sqe, request.tag);
    ++unsubmitted_;
    return 0;
  }

  int reap(std::vector<IoCompletion>* completions) override {
    // Poll for a short while before sleeping: in a VM the sleep and the wake-up
    // interrupt cost more than a fast IO takes (fio, too, mostly polls).
    uint64_t deadline = monotonic_ns() + kPollNs;
    do {
      int rc =
          unsubmitted_ > 0 ? io_uring_submit_and_get_events(&ring_) : io_uring_get_events(&ring_);
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) return rc;
      if (rc >= 0) unsubmitted_ = 0;
      if (int count = drain(completions); count > 0) return count;
    } while (monotonic_ns() < deadline);
    io_uring_cqe* cqe = nullptr;
    int rc;
    do {
      rc = unsubmitted_ > 0 ? io_uring_submit_and_wait(&ring_, 1) : io_uring_wait_cqe(&ring_, &cqe);
    } while (rc == -EINTR);
    if (rc < 0) return rc;
    unsubmitted_ = 0;
    return drain(completions);
  }

 private:
  static constexpr uint64_t kPollNs = 100'000;

  int drain(std::vector<IoCompletion>* completions) {
    io_uring_cqe* cqe = nullptr;
    int count = 0;
    while (io_uring_peek_cqe(&ring_, &cqe) == 0) {
      completions->push_back({io_uring_cqe_get_data64(cqe), cqe->res});
      io_uring_cqe_seen(&ring_, cqe);
      ++count;
    }
    return count;
  }

  io_uring ring_{};
  unsigned depth_;
  std::vector<int> fds_;
  bool ready_ = false;
  bool fixed_file_ = false;
  bool single_issuer_ = false;
  const BufferPool* pool_ = nullptr;
  unsigned unsubmitted_ = 0;
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
