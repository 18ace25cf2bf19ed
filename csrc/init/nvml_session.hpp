// NVML loaded with dlopen (libnvidia-ml.so.1), for pod-init-nvml alone: the
// static pod-init never loads a vendor library into PID 1.
#pragma once

#include <string>

#include "init/nvml_state.hpp"

namespace pod_init {

// NVML through dlopen (libnvidia-ml.so.1): only pod-init-nvml links this.
class NvmlSession {
 public:
  NvmlSession() = default;
  ~NvmlSession();
  NvmlSession(const NvmlSession&) = delete;
  NvmlSession& operator=(const NvmlSession&) = delete;

  // Loads and initialises NVML; "" or what went wrong, in one line.
  std::string open();
  // Fills `state` for the GPU at `bdf`; "" or what went wrong.
  std::string read(const std::string& bdf, GpuNvmlState* state);
  std::string enable_persistence(const std::string& bdf);

 private:
  struct Api;
  void* library_ = nullptr;
  Api* api_ = nullptr;
  bool initialised_ = false;
};

}  // namespace pod_init
