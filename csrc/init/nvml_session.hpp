// PID 1's questions to NVML, asked by pod-init-nvml: the static pod-init
// never loads a vendor library into PID 1.
#pragma once

#include <string>

#include "init/nvml_state.hpp"
#include "nvml/nvml_library.hpp"

namespace pod_init {

class NvmlSession {
 public:
  // Loads and initialises NVML; "" or what went wrong, in one line.
  std::string open() { return library_.open(); }
  // Fills `state` for the GPU at `bdf`; "" or what went wrong.
  std::string read(const std::string& bdf, GpuNvmlState* state);
  std::string enable_persistence(const std::string& bdf);

 private:
  nvml::Library library_;
};

}  // namespace pod_init
