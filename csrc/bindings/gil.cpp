// ReleasedGil (bindings.hpp): a blocking call's GIL release that cannot end
// the process at interpreter exit.
#include <Python.h>
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

}  // namespace

ReleasedGil::~ReleasedGil() noexcept(false) {
  if (finalizing()) {
    for (;;) pause();  // the process is ending: exit_group() ends this thread
  }
  PyEval_RestoreThread(state_);
}

}  // namespace pod_init::bindings
