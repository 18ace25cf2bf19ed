#include "nvml/nvml_gpus.hpp"

#include <cstring>
#include <stdexcept>

namespace pod_init::nvml {

namespace {

// nvml.h's enumerators for the values these queries pass.
constexpr int kFeatureEnabled = 1;             // NVML_FEATURE_ENABLED
constexpr int kUncorrectedErrors = 1;          // NVML_MEMORY_ERROR_TYPE_UNCORRECTED
constexpr int kVolatileCounter = 0;            // NVML_VOLATILE_ECC: since the driver loaded
constexpr int kPcieTxBytes = 0;                // NVML_PCIE_UTIL_TX_BYTES
constexpr int kPcieRxBytes = 1;                // NVML_PCIE_UTIL_RX_BYTES
constexpr int kGpuSensor = 0;                  // NVML_TEMPERATURE_GPU
constexpr unsigned kNvLinkTxField = 138;       // NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, KiB
constexpr unsigned kNvLinkRxField = 139;       // NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, KiB
constexpr unsigned long long kXidEvent = 0x8;  // nvmlEventTypeXidCriticalError

// A text NVML wrote into `buffer`, up to its end should it hold no NUL.
template <size_t N>
std::string text_in(const char (&buffer)[N]) {
  return std::string(buffer, strnlen(buffer, N));
}

}  // namespace

NvmlGpus::~NvmlGpus() {
  if (events_ != nullptr) library_.call(&Api::event_set_free, events_);
}

std::string NvmlGpus::open(const std::string& library_path) {
  std::string problem = library_.open(library_path.c_str());
  if (!problem.empty()) return problem;
  unsigned count = 0;
  Return result = library_.call(&Api::device_count, &count);
  if (result != kSuccess) return refusal("nvmlDeviceGetCount_v2", -1, library_.error(result));
  devices_.assign(count, nullptr);
  for (unsigned gpu = 0; gpu < count; ++gpu) {
    result = library_.call(&Api::handle_by_index, gpu, &devices_[gpu]);
    if (result != kSuccess) {
      return refusal("nvmlDeviceGetHandleByIndex_v2", int(gpu), library_.error(result));
    }
  }
  return "";
}

Device NvmlGpus::device(unsigned gpu) const {
  if (gpu >= devices_.size()) {
    throw std::out_of_range("no GPU " + std::to_string(gpu) + " (NVML counts " +
                            std::to_string(devices_.size()) + ")");
  }
  return devices_[gpu];
}

void NvmlGpus::check(Return result, const char* call, int gpu) const {
  if (result != kSuccess) throw Error(result, call, gpu, library_.error(result));
}

std::string NvmlGpus::driver_version() const {
  char text[kTextSize] = {};
  check(library_.call(&Api::driver_version, text, kTextSize), "nvmlSystemGetDriverVersion", -1);
  return text_in(text);
}

std::string NvmlGpus::bus_id(unsigned gpu) const {
  PciInfo pci{};
  check(library_.call(&Api::pci_info, device(gpu), &pci), "nvmlDeviceGetPciInfo_v3", int(gpu));
  return text_in(pci.bus_id);
}

std::string NvmlGpus::name(unsigned gpu) const {
  char text[kTextSize] = {};
  check(library_.call(&Api::name, device(gpu), text, kTextSize), "nvmlDeviceGetName", int(gpu));
  return text_in(text);
}

std::pair<int, int> NvmlGpus::cuda_capability(unsigned gpu) const {
  int major = 0, minor = 0;
  check(library_.call(&Api::compute_capability, device(gpu), &major, &minor),
        "nvmlDeviceGetCudaComputeCapability", int(gpu));
  return {major, minor};
}

unsigned long long NvmlGpus::memory_total(unsigned gpu) const {
  Memory memory{};
  check(library_.call(&Api::memory_info, device(gpu), &memory), "nvmlDeviceGetMemoryInfo",
        int(gpu));
  return memory.total;
}

unsigned long long NvmlGpus::bar1_total(unsigned gpu) const {
  Bar1Memory bar1{};
  check(library_.call(&Api::bar1_memory_info, device(gpu), &bar1), "nvmlDeviceGetBAR1MemoryInfo",
        int(gpu));
  return bar1.total;
}

PcieLink NvmlGpus::pcie_link(unsigned gpu) const {
  PcieLink link{};
  Device handle = device(gpu);
  check(library_.call(&Api::pcie_generation, handle, &link.generation),
        "nvmlDeviceGetCurrPcieLinkGeneration", int(gpu));
  check(library_.call(&Api::pcie_max_generation, handle, &link.max_generation),
        "nvmlDeviceGetMaxPcieLinkGeneration", int(gpu));
  check(library_.call(&Api::pcie_width, handle, &link.width), "nvmlDeviceGetCurrPcieLinkWidth",
        int(gpu));
  check(library_.call(&Api::pcie_max_width, handle, &link.max_width),
        "nvmlDeviceGetMaxPcieLinkWidth", int(gpu));
  return link;
}

std::vector<NvLinkEnd> NvmlGpus::nvlinks(unsigned gpu) const {
  Device handle = device(gpu);
  std::vector<NvLinkEnd> links;
  for (unsigned link = 0; link < kMaxNvLinks; ++link) {
    // NotSupported past the part's last link, or on a GPU without NVLink.
    int state = 0;
    if (library_.call(&Api::nvlink_state, handle, link, &state) != kSuccess ||
        state != kFeatureEnabled) {
      continue;
    }
    PciInfo remote{};
    if (library_.call(&Api::nvlink_remote_pci, handle, link, &remote) != kSuccess) continue;
    NvLinkEnd end{link, text_in(remote.bus_id), std::nullopt};
    unsigned type = 0;
    if (library_.call(&Api::nvlink_remote_type, handle, link, &type) == kSuccess) {
      end.remote_type = type;
    }
    links.push_back(end);
  }
  return links;
}

int NvmlGpus::p2p_status(unsigned a, unsigned b, int capability) const {
  int status = 0;
  check(library_.call(&Api::p2p_status, device(a), device(b), capability, &status),
        "nvmlDeviceGetP2PStatus", int(a));
  return status;
}

int NvmlGpus::common_ancestor(unsigned a, unsigned b) const {
  int level = 0;
  check(library_.call(&Api::common_ancestor, device(a), device(b), &level),
        "nvmlDeviceGetTopologyCommonAncestor", int(a));
  return level;
}

GpuHealth NvmlGpus::health(unsigned gpu) const {
  Device handle = device(gpu);
  GpuHealth health;
  int current = 0, pending = 0;
  if (library_.call(&Api::ecc_mode, handle, &current, &pending) == kSuccess) {
    health.ecc_enabled = current != 0;
    unsigned long long errors = 0;
    if (library_.call(&Api::total_ecc_errors, handle, kUncorrectedErrors, kVolatileCounter,
                      &errors) == kSuccess) {
      health.ecc_uncorrected_volatile = errors;
    }
  }
  unsigned corrected = 0, uncorrected = 0, remap_pending = 0, failed = 0;
  if (library_.call(&Api::remapped_rows, handle, &corrected, &uncorrected, &remap_pending,
                    &failed) == kSuccess) {
    health.remapped_uncorrectable = uncorrected;
    health.remap_pending = remap_pending != 0;
    health.remap_failed = failed != 0;
  }
  return health;
}

GpuCounters NvmlGpus::counters(unsigned gpu) const {
  Device handle = device(gpu);
  GpuCounters out{};
  char uuid[kTextSize] = {};
  check(library_.call(&Api::uuid, handle, uuid, kTextSize), "nvmlDeviceGetUUID", int(gpu));
  out.uuid = text_in(uuid);
  Utilization busy{};
  check(library_.call(&Api::utilization, handle, &busy), "nvmlDeviceGetUtilizationRates", int(gpu));
  out.utilization_percent = busy.gpu;
  Memory memory{};
  check(library_.call(&Api::memory_info, handle, &memory), "nvmlDeviceGetMemoryInfo", int(gpu));
  out.memory_used_bytes = memory.used;
  unsigned tx_kib = 0, rx_kib = 0;  // NVML's "KB/s" are KiB
  check(library_.call(&Api::pcie_throughput, handle, kPcieTxBytes, &tx_kib),
        "nvmlDeviceGetPcieThroughput", int(gpu));
  check(library_.call(&Api::pcie_throughput, handle, kPcieRxBytes, &rx_kib),
        "nvmlDeviceGetPcieThroughput", int(gpu));
  out.pcie_tx_bytes_per_s = 1024.0 * tx_kib;
  out.pcie_rx_bytes_per_s = 1024.0 * rx_kib;
  check(library_.call(&Api::temperature, handle, kGpuSensor, &out.temperature_celsius),
        "nvmlDeviceGetTemperature", int(gpu));
  // One field value per link and direction (the scope is the link); inactive
  // links answer errors of their own.
  FieldValue fields[2 * kMaxNvLinks] = {};
  for (unsigned link = 0; link < kMaxNvLinks; ++link) {
    fields[link].field_id = kNvLinkTxField;
    fields[kMaxNvLinks + link].field_id = kNvLinkRxField;
    fields[link].scope_id = fields[kMaxNvLinks + link].scope_id = link;
  }
  if (library_.call(&Api::field_values, handle, int(2 * kMaxNvLinks), fields) == kSuccess) {
    auto total = [&](const FieldValue* half) -> std::optional<unsigned long long> {
      std::optional<unsigned long long> sum;
      for (unsigned link = 0; link < kMaxNvLinks; ++link) {
        if (half[link].result == kSuccess) sum = sum.value_or(0) + 1024 * half[link].value.ull;
      }
      return sum;
    };
    out.nvlink_tx_bytes_total = total(fields);
    out.nvlink_rx_bytes_total = total(fields + kMaxNvLinks);
  }
  return out;
}

bool NvmlGpus::watch_xids(const std::vector<unsigned>& gpus) {
  if (events_ == nullptr && library_.call(&Api::event_set_create, &events_) != kSuccess) {
    events_ = nullptr;
    return false;
  }
  for (unsigned gpu : gpus) library_.call(&Api::register_events, device(gpu), kXidEvent, events_);
  return true;
}

std::vector<std::pair<unsigned, unsigned long long>> NvmlGpus::xid_events() {
  std::vector<std::pair<unsigned, unsigned long long>> found;
  EventData event{};
  // A wait of 0 ms answers kTimeout once nothing (more) is pending.
  while (events_ != nullptr &&
         library_.call(&Api::event_set_wait, events_, &event, 0u) == kSuccess) {
    for (unsigned gpu = 0; gpu < devices_.size(); ++gpu) {
      if (devices_[gpu] == event.device) found.emplace_back(gpu, event.data);
    }
  }
  return found;
}

}  // namespace pod_init::nvml
