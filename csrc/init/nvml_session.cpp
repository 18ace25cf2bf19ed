#include "init/nvml_session.hpp"

#include <dlfcn.h>

#include <cctype>
#include <cstdio>
#include <map>
#include <string>

namespace pod_init {

// NVML's own types, as nvml.h declares them (the header is not needed to build).
namespace {

using NvmlReturn = int;
using NvmlDevice = void*;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr unsigned kNvLinkMaxLinks = 18;     // NVML_NVLINK_MAX_LINKS
constexpr unsigned kNvLinkDeviceSwitch = 2;  // NVML_NVLINK_DEVICE_TYPE_SWITCH

struct NvmlPciInfo {
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
};

struct NvmlGpuFabricInfo {
  unsigned char cluster_uuid[16];
  NvmlReturn status;
  unsigned clique_id;
  unsigned char state;
};

// "00000000:18:00.0" (NVML's) -> "0000:18:00.0" (sysfs's).
std::string sysfs_bdf(const char* nvml) {
  std::string id(nvml);
  for (char& c : id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  size_t colon = id.find(':');
  if (colon != std::string::npos && colon > 4) id.erase(0, colon - 4);
  return id;
}

}  // namespace

struct NvmlSession::Api {
  NvmlReturn (*init)();
  NvmlReturn (*shutdown)();
  const char* (*error_string)(NvmlReturn);
  NvmlReturn (*handle_by_bus_id)(const char*, NvmlDevice*);
  NvmlReturn (*get_persistence)(NvmlDevice, int*);
  NvmlReturn (*set_persistence)(NvmlDevice, int);
  NvmlReturn (*fabric_info)(NvmlDevice, NvmlGpuFabricInfo*);
  NvmlReturn (*compute_capability)(NvmlDevice, int*, int*);
  NvmlReturn (*link_state)(NvmlDevice, unsigned, int*);
  NvmlReturn (*link_remote_pci)(NvmlDevice, unsigned, NvmlPciInfo*);
  NvmlReturn (*link_remote_type)(NvmlDevice, unsigned, unsigned*);
};

NvmlSession::~NvmlSession() {
  if (initialised_) api_->shutdown();
  delete api_;
  if (library_ != nullptr) dlclose(library_);
}

std::string NvmlSession::open() {
  library_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library_ == nullptr) return std::string("cannot load NVML: ") + dlerror();
  api_ = new Api{};
  std::string missing;
  auto bind = [&](auto& slot, const char* name, bool required) {
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(dlsym(library_, name));
    if (slot == nullptr && required) missing += std::string(missing.empty() ? "" : ", ") + name;
  };
  bind(api_->init, "nvmlInit_v2", true);
  bind(api_->shutdown, "nvmlShutdown", true);
  bind(api_->error_string, "nvmlErrorString", true);
  bind(api_->handle_by_bus_id, "nvmlDeviceGetHandleByPciBusId_v2", true);
  bind(api_->get_persistence, "nvmlDeviceGetPersistenceMode", true);
  bind(api_->set_persistence, "nvmlDeviceSetPersistenceMode", true);
  // Older drivers lack these: their GPUs then have no fabric, links or sm to say.
  bind(api_->fabric_info, "nvmlDeviceGetGpuFabricInfo", false);
  bind(api_->compute_capability, "nvmlDeviceGetCudaComputeCapability", false);
  bind(api_->link_state, "nvmlDeviceGetNvLinkState", false);
  bind(api_->link_remote_pci, "nvmlDeviceGetNvLinkRemotePciInfo_v2", false);
  bind(api_->link_remote_type, "nvmlDeviceGetNvLinkRemoteDeviceType", false);
  if (!missing.empty()) return "NVML lacks " + missing;
  NvmlReturn rc = api_->init();
  if (rc != kNvmlSuccess) return std::string("nvmlInit: ") + api_->error_string(rc);
  initialised_ = true;
  return "";
}

std::string NvmlSession::read(const std::string& bdf, GpuNvmlState* state) {
  NvmlDevice device = nullptr;
  NvmlReturn rc = api_->handle_by_bus_id(bdf.c_str(), &device);
  if (rc != kNvmlSuccess) return bdf + ": " + api_->error_string(rc);
  state->bdf = bdf;
  int mode = 0;
  state->persistence = api_->get_persistence(device, &mode) == kNvmlSuccess ? mode != 0 : -1;
  state->fabric = FabricState::NotSupported;
  NvmlGpuFabricInfo fabric{};
  if (api_->fabric_info != nullptr && api_->fabric_info(device, &fabric) == kNvmlSuccess) {
    state->fabric =
        fabric.state <= 3 ? static_cast<FabricState>(fabric.state) : FabricState::Unknown;
    state->fabric_status = fabric.status;
  }
  int major = 0, minor = 0;
  if (api_->compute_capability != nullptr &&
      api_->compute_capability(device, &major, &minor) == kNvmlSuccess) {
    state->details.sm = major * 10 + minor;
  }
  std::map<std::string, int> links;  // target -> active links
  for (unsigned link = 0; api_->link_state != nullptr && link < kNvLinkMaxLinks; ++link) {
    int active = 0;
    if (api_->link_state(device, link, &active) != kNvmlSuccess || !active) continue;
    unsigned type = 0;
    NvmlPciInfo remote{};
    if (api_->link_remote_type != nullptr &&
        api_->link_remote_type(device, link, &type) == kNvmlSuccess &&
        type == kNvLinkDeviceSwitch) {
      ++links[kNvSwitchTarget];
    } else if (api_->link_remote_pci != nullptr &&
               api_->link_remote_pci(device, link, &remote) == kNvmlSuccess) {
      ++links[sysfs_bdf(remote.bus_id)];
    }
  }
  state->details.nvlinks.clear();
  for (const auto& [target, count] : links) {
    NvLinkPeer peer = target == kNvSwitchTarget ? NvLinkPeer::Switch : NvLinkPeer::Gpu;
    state->details.nvlinks.push_back({target, peer, count});
  }
  return "";
}

std::string NvmlSession::enable_persistence(const std::string& bdf) {
  NvmlDevice device = nullptr;
  NvmlReturn rc = api_->handle_by_bus_id(bdf.c_str(), &device);
  if (rc == kNvmlSuccess) rc = api_->set_persistence(device, 1);
  return rc == kNvmlSuccess ? "" : bdf + ": persistence: " + api_->error_string(rc);
}

}  // namespace pod_init
