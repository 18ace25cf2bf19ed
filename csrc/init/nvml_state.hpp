// What PID 1 needs from NVML: each GPU's persistence mode, fabric state (the
// fabric manager's work on NVSwitch boards), compute capability and NVLinks.
// NVML is a vendor library: the static PID 1 never loads it; the small
// dynamically linked pod-init-nvml does, and prints one line per GPU, which
// PID 1 parses (format_gpu_state / parse_gpu_state are that protocol).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "topology/nvlink.hpp"

namespace pod_init {

// nvmlGpuFabricState_t's values, and -1 when NVML was not asked or failed.
enum class FabricState {
  Unknown = -1,
  NotSupported = 0,
  NotStarted = 1,
  InProgress = 2,
  Completed = 3
};
const char* fabric_state_name(FabricState state);

struct GpuNvmlState {
  std::string bdf;       // "0000:18:00.0"
  int persistence = -1;  // 1 on, 0 off, -1 unknown
  FabricState fabric = FabricState::Unknown;
  int fabric_status = 0;  // nvmlReturn_t of the fabric probe itself (0: success)
  GpuDetails details;     // sm and NVLinks
};

// A GPU's state needs nothing more before CUDA may start: the fabric manager
// has finished (or the GPU has no fabric).
bool fabric_ready(const GpuNvmlState& state);

// "gpu BDF persistence=on fabric=completed fabric_status=0 sm=90 nvlinks=T*N,T*N"
std::string format_gpu_state(const GpuNvmlState& state);
// false for a line that is not such a line (it is then the helper's message).
bool parse_gpu_state(std::string_view line, GpuNvmlState* state);

}  // namespace pod_init
