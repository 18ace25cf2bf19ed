// What pyinit asks NVML about a node's GPUs (its topology, health and
// counters), each GPU by NVML's index. This is an API layer: a query NVML
// refuses throws nvml::Error naming the call and the GPU; where NVML may
// rightly have no answer (no ECC on a part, no NVLink, no row remapping
// before Ampere), the answer is empty instead.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nvml/nvml_library.hpp"

namespace pod_init::nvml {

struct PcieLink {
  unsigned generation, max_generation, width, max_width;
};

struct NvLinkEnd {
  unsigned link;
  std::string remote_bus_id;            // NVML's form: "00000000:18:00.0"
  std::optional<unsigned> remote_type;  // nvmlIntNvLinkDeviceType_t; empty where not told
};

struct GpuHealth {
  std::optional<bool> ecc_enabled;
  std::optional<unsigned long long> ecc_uncorrected_volatile;  // since the driver loaded
  std::optional<unsigned> remapped_uncorrectable;
  std::optional<bool> remap_pending, remap_failed;
};

struct GpuCounters {
  std::string uuid;
  unsigned utilization_percent;
  unsigned long long memory_used_bytes;
  double pcie_tx_bytes_per_s, pcie_rx_bytes_per_s;  // over NVML's last 20 ms window
  unsigned temperature_celsius;
  // NVLink data bytes since the driver loaded, summed over the links that
  // count them; empty where none does.
  std::optional<unsigned long long> nvlink_tx_bytes_total, nvlink_rx_bytes_total;
};

class NvmlGpus {
 public:
  NvmlGpus() = default;
  NvmlGpus(const NvmlGpus&) = delete;
  NvmlGpus& operator=(const NvmlGpus&) = delete;
  ~NvmlGpus();

  // Loads and initialises NVML, and counts its GPUs: "" or why not, in one line.
  std::string open(const std::string& library_path);
  bool is_open() const { return library_.is_open(); }

  std::string driver_version() const;
  unsigned count() const { return static_cast<unsigned>(devices_.size()); }
  std::string bus_id(unsigned gpu) const;
  std::string name(unsigned gpu) const;
  std::pair<int, int> cuda_capability(unsigned gpu) const;
  unsigned long long memory_total(unsigned gpu) const;
  unsigned long long bar1_total(unsigned gpu) const;
  PcieLink pcie_link(unsigned gpu) const;
  // The active links; a link NVML cannot describe is left out.
  std::vector<NvLinkEnd> nvlinks(unsigned gpu) const;
  int p2p_status(unsigned a, unsigned b, int capability) const;  // nvmlGpuP2PStatus_t
  int common_ancestor(unsigned a, unsigned b) const;             // nvmlGpuTopologyLevel_t
  GpuHealth health(unsigned gpu) const;
  GpuCounters counters(unsigned gpu) const;

  // Xid events from these GPUs, from now on: false where this driver or GPU
  // delivers none (some VMs), and the other queries still work.
  bool watch_xids(const std::vector<unsigned>& gpus);
  // (GPU, Xid) for each event since the last call; never blocks.
  std::vector<std::pair<unsigned, unsigned long long>> xid_events();

 private:
  nvml::Device device(unsigned gpu) const;
  void check(Return result, const char* call, int gpu) const;

  Library library_;
  std::vector<nvml::Device> devices_;
  EventSet events_ = nullptr;
};

}  // namespace pod_init::nvml
