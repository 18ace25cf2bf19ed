#include "nvml/nvml_library.hpp"

#include <dlfcn.h>

#include <type_traits>

namespace pod_init::nvml {

std::string refusal(const std::string& call, int gpu, const std::string& text) {
  return (gpu >= 0 ? "GPU " + std::to_string(gpu) + ": " : std::string()) + call + ": " + text;
}

Error::Error(Return result, const std::string& call, int gpu, const std::string& text)
    : std::runtime_error(refusal(call, gpu, text)), result_(result) {}

// The library stays loaded: nvmlInit starts threads of the driver's own
// (libcuda's, driver 580) that may outlive nvmlShutdown, and unloading code a
// thread still runs would crash the process later (a launcher that read NVML
// in its preflight runs for days). Another open() takes the same handle.
Library::~Library() {
  if (initialised_) api_.shutdown();
}

std::string Library::open(const char* path) {
  void* library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) return std::string("cannot load NVML: ") + dlerror();
  auto bind = [&](auto& slot, const char* name) {
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(dlsym(library, name));
  };
  bind(api_.init, "nvmlInit_v2");
  bind(api_.shutdown, "nvmlShutdown");
  bind(api_.error_string, "nvmlErrorString");
  if (api_.init == nullptr || api_.shutdown == nullptr || api_.error_string == nullptr) {
    api_ = Api{};
    dlclose(library);  // none of its functions was called
    return std::string(path) +
           " is not NVML: it lacks nvmlInit_v2, nvmlShutdown or nvmlErrorString";
  }
  bind(api_.driver_version, "nvmlSystemGetDriverVersion");
  bind(api_.device_count, "nvmlDeviceGetCount_v2");
  bind(api_.handle_by_index, "nvmlDeviceGetHandleByIndex_v2");
  bind(api_.handle_by_bus_id, "nvmlDeviceGetHandleByPciBusId_v2");
  bind(api_.device_index, "nvmlDeviceGetIndex");
  bind(api_.pci_info, "nvmlDeviceGetPciInfo_v3");
  bind(api_.name, "nvmlDeviceGetName");
  bind(api_.uuid, "nvmlDeviceGetUUID");
  bind(api_.compute_capability, "nvmlDeviceGetCudaComputeCapability");
  bind(api_.memory_info, "nvmlDeviceGetMemoryInfo");
  bind(api_.bar1_memory_info, "nvmlDeviceGetBAR1MemoryInfo");
  bind(api_.pcie_generation, "nvmlDeviceGetCurrPcieLinkGeneration");
  bind(api_.pcie_max_generation, "nvmlDeviceGetMaxPcieLinkGeneration");
  bind(api_.pcie_width, "nvmlDeviceGetCurrPcieLinkWidth");
  bind(api_.pcie_max_width, "nvmlDeviceGetMaxPcieLinkWidth");
  bind(api_.pcie_throughput, "nvmlDeviceGetPcieThroughput");
  bind(api_.utilization, "nvmlDeviceGetUtilizationRates");
  bind(api_.temperature, "nvmlDeviceGetTemperature");
  bind(api_.field_values, "nvmlDeviceGetFieldValues");
  bind(api_.nvlink_state, "nvmlDeviceGetNvLinkState");
  bind(api_.nvlink_remote_pci, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
  bind(api_.nvlink_remote_type, "nvmlDeviceGetNvLinkRemoteDeviceType");
  bind(api_.p2p_status, "nvmlDeviceGetP2PStatus");
  bind(api_.common_ancestor, "nvmlDeviceGetTopologyCommonAncestor");
  bind(api_.ecc_mode, "nvmlDeviceGetEccMode");
  bind(api_.total_ecc_errors, "nvmlDeviceGetTotalEccErrors");
  bind(api_.remapped_rows, "nvmlDeviceGetRemappedRows");
  bind(api_.get_persistence, "nvmlDeviceGetPersistenceMode");
  bind(api_.set_persistence, "nvmlDeviceSetPersistenceMode");
  bind(api_.fabric_info, "nvmlDeviceGetGpuFabricInfo");
  bind(api_.event_set_create, "nvmlEventSetCreate");
  bind(api_.event_set_free, "nvmlEventSetFree");
  bind(api_.register_events, "nvmlDeviceRegisterEvents");
  bind(api_.event_set_wait, "nvmlEventSetWait_v2");
  Return result = api_.init();
  if (result != kSuccess) return refusal("nvmlInit", -1, error(result));
  initialised_ = true;
  return "";
}

std::string Library::error(Return result) const {
  if (result == kFunctionNotFound) return "Function Not Found";
  const char* text = api_.error_string != nullptr ? api_.error_string(result) : nullptr;
  return text != nullptr ? text : "NVML error " + std::to_string(result);
}

}  // namespace pod_init::nvml
