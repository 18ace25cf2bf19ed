#include "init/nvml_session.hpp"

#include <cctype>
#include <map>
#include <string>

namespace pod_init {

namespace {

using nvml::Api;

constexpr unsigned kNvLinkDeviceSwitch = 2;  // NVML_NVLINK_DEVICE_TYPE_SWITCH

// "00000000:18:00.0" (NVML's) -> "0000:18:00.0" (sysfs's).
std::string sysfs_bdf(const char* bus_id) {
  std::string id(bus_id);
  for (char& c : id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  size_t colon = id.find(':');
  if (colon != std::string::npos && colon > 4) id.erase(0, colon - 4);
  return id;
}

}  // namespace

std::string NvmlSession::read(const std::string& bdf, GpuNvmlState* state) {
  nvml::Device device = nullptr;
  nvml::Return rc = library_.call(&Api::handle_by_bus_id, bdf.c_str(), &device);
  if (rc != nvml::kSuccess) return bdf + ": " + library_.error(rc);
  state->bdf = bdf;
  int mode = 0;
  state->persistence =
      library_.call(&Api::get_persistence, device, &mode) == nvml::kSuccess ? mode != 0 : -1;
  // Older drivers lack the fabric, link and capability queries: their GPUs
  // then have no fabric, links or sm to say.
  state->fabric = FabricState::NotSupported;
  nvml::GpuFabricInfo fabric{};
  if (library_.call(&Api::fabric_info, device, &fabric) == nvml::kSuccess) {
    state->fabric =
        fabric.state <= 3 ? static_cast<FabricState>(fabric.state) : FabricState::Unknown;
    state->fabric_status = fabric.status;
  }
  int major = 0, minor = 0;
  if (library_.call(&Api::compute_capability, device, &major, &minor) == nvml::kSuccess) {
    state->details.sm = major * 10 + minor;
  }
  std::map<std::string, int> links;  // target -> active links
  for (unsigned link = 0; link < nvml::kMaxNvLinks; ++link) {
    int active = 0;
    if (library_.call(&Api::nvlink_state, device, link, &active) != nvml::kSuccess || !active) {
      continue;
    }
    unsigned type = 0;
    nvml::PciInfo remote{};
    if (library_.call(&Api::nvlink_remote_type, device, link, &type) == nvml::kSuccess &&
        type == kNvLinkDeviceSwitch) {
      ++links[kNvSwitchTarget];
    } else if (library_.call(&Api::nvlink_remote_pci, device, link, &remote) == nvml::kSuccess) {
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
  nvml::Device device = nullptr;
  nvml::Return rc = library_.call(&Api::handle_by_bus_id, bdf.c_str(), &device);
  if (rc == nvml::kSuccess) rc = library_.call(&Api::set_persistence, device, 1);
  return rc == nvml::kSuccess ? "" : bdf + ": persistence: " + library_.error(rc);
}

}  // namespace pod_init
