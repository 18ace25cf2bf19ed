// Where reads are executed: io_uring (liburing) or a pread thread pool. Both
// take reads at explicit offsets, keep up to depth() in flight and hand back
// completions by tag; the reader above them decides what to read.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/aligned_buffer.hpp"
#include "io/io_choice.hpp"

namespace pod_init {

struct IoRequest {
  uint64_t tag = 0;
  uint32_t file = 0;  // index into the descriptors the backend was made with
  uint8_t* buffer = nullptr;
  uint64_t offset = 0;
  uint32_t length = 0;
  bool write = false;  // from buffer to the file
};

struct IoCompletion {
  uint64_t tag = 0;
  int64_t result = 0;  // bytes read, or -errno
};

class IoBackend {
 public:
  virtual ~IoBackend() = default;
  virtual const char* name() const = 0;
  // What the backend could not set up and works without (registered buffers...).
  virtual std::string note() const { return ""; }
  virtual unsigned depth() const = 0;
  // True when only the thread that made the backend may use it.
  virtual bool single_thread() const { return false; }
  // Queues one IO; at most depth() may be outstanding. Returns 1 when it goes
  // through a registered buffer (no page pinning per IO), 0 when not, or -errno.
  virtual int submit(const IoRequest& request) = 0;
  // Waits until at least one outstanding IO completes and appends every
  // completion there is. Returns the number appended or -errno.
  virtual int reap(std::vector<IoCompletion>* completions) = 0;
  // Hands the queued IOs to the kernel and appends the completions there are,
  // without waiting for any. Returns the number appended or -errno.
  virtual int poll(std::vector<IoCompletion>* completions) = 0;
};

// Returns 0 or -errno: -ENOSYS (kernel without io_uring), -EPERM (disabled by
// sysctl or refused by a seccomp sandbox), -ENOMEM... `pool` (may be null; it
// must outlive the backend) and the regions of IoMemory that requests land in
// are registered as fixed buffers when the kernel and the memlock limit allow.
int make_uring_backend(const std::vector<int>& fds, unsigned depth, const BufferPool* pool,
                       std::unique_ptr<IoBackend>* backend);

std::unique_ptr<IoBackend> make_pread_backend(std::vector<int> fds, unsigned depth);

// The one choice of backend, for the reader, its streams and the writer:
// Pread as asked; IoUring or a SysError (io_uring_setup) when the kernel
// refuses it; Auto falls back to the thread pool, saying why in `note`
// ("" when nothing was fallen back from).
std::unique_ptr<IoBackend> choose_backend(BackendChoice choice, const std::vector<int>& fds,
                                          unsigned depth, const BufferPool* pool,
                                          std::string* note);

}  // namespace pod_init
