#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#include "common/error.hpp"
#include "io/detail/io_backend.hpp"

namespace pod_init {

namespace {

// The portable path: a thread per slot of queue depth (at most 64), each doing
// blocking pread()s and pwrite()s.
class PreadBackend : public IoBackend {
 public:
  PreadBackend(std::vector<int> fds, unsigned depth) : fds_(std::move(fds)), depth_(depth) {
    unsigned threads = std::min(depth, 64u);
    try {
      for (unsigned i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
    } catch (const std::system_error& error) {
      // Out of threads (EAGAIN: a pids cgroup, RLIMIT_NPROC): those started
      // are joined, or their destructors would end the process (std::terminate).
      stop();
      throw SysError(error.code().value(), "pthread_create");
    }
  }
  ~PreadBackend() override { stop(); }

  const char* name() const override { return "pread"; }
  unsigned depth() const override { return depth_; }

  int submit(const IoRequest& request) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(request);
      ++outstanding_;
    }
    wake_workers_.notify_one();
    return 0;
  }

  int reap(std::vector<IoCompletion>* completions) override {
    std::unique_lock<std::mutex> lock(mutex_);
    wake_reaper_.wait(lock, [this] { return !done_.empty() || outstanding_ == 0; });
    return take_done(completions);
  }

  int poll(std::vector<IoCompletion>* completions) override {
    std::lock_guard<std::mutex> lock(mutex_);
    return take_done(completions);
  }

 private:
  int take_done(std::vector<IoCompletion>* completions) {  // call with mutex_ held
    int count = static_cast<int>(done_.size());
    completions->insert(completions->end(), done_.begin(), done_.end());
    outstanding_ -= done_.size();
    done_.clear();
    return count;
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_workers_.notify_all();
    for (std::thread& worker : workers_) worker.join();
    workers_.clear();
  }

  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_workers_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      IoRequest request = queue_.front();
      queue_.pop_front();
      lock.unlock();
      ssize_t n;
      do {
        n = request.write ? pwrite(fds_[request.file], request.buffer, request.length,
                                   static_cast<off_t>(request.offset))
                          : pread(fds_[request.file], request.buffer, request.length,
                                  static_cast<off_t>(request.offset));
      } while (n < 0 && errno == EINTR);
      IoCompletion completion{request.tag, n < 0 ? -static_cast<int64_t>(errno) : n};
      lock.lock();
      done_.push_back(completion);
      wake_reaper_.notify_one();
    }
  }

  std::vector<int> fds_;
  unsigned depth_;
  std::mutex mutex_;
  std::condition_variable wake_workers_, wake_reaper_;
  std::deque<IoRequest> queue_;
  std::vector<IoCompletion> done_;
  size_t outstanding_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<IoBackend> make_pread_backend(std::vector<int> fds, unsigned depth) {
  return std::make_unique<PreadBackend>(std::move(fds), depth);
}

std::unique_ptr<IoBackend> choose_backend(BackendChoice choice, const std::vector<int>& fds,
                                          unsigned depth, const BufferPool* pool,
                                          std::string* note) {
  note->clear();
  if (choice != BackendChoice::Pread) {
    std::unique_ptr<IoBackend> uring;
    int rc = make_uring_backend(fds, depth, pool, &uring);
    if (rc == 0) return uring;
    if (choice == BackendChoice::IoUring) throw SysError(-rc, "io_uring_setup");
    *note = "io_uring unavailable (" + errno_name(-rc) + "): " + errno_text(-rc);
  }
  return make_pread_backend(fds, depth);
}

}  // namespace pod_init
