// ReleasedGil (bindings.hpp): a blocking call's GIL release that cannot end
// the process at interpreter exit.
#include <Python.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "bindings/bindings.hpp"

namespace pod_init::bindings {

namespace {

bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// Whether this is the thread Python finalises on: the process's first thread,
// where Py_Main runs the script and then finalises (a forked child's only
// thread is its first). An interpreter embedded on another thread would find
// its finalising thread parked here.
bool finalizing_thread() { return syscall(SYS_gettid) == getpid(); }

}  // namespace

ReleasedGil::~ReleasedGil() noexcept(false) {
  if (finalizing() && !finalizing_thread()) {
    for (;;) pause();  // the process is ending: exit_group() ends this thread
  }
  PyEval_RestoreThread(state_);
}

}  // namespace pod_init::bindings
