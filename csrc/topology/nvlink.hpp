// What sysfs cannot show about GPUs: NVLinks and compute capability. The
// executable has no NVML, so these come from the Python layer (NVML) or stay
// empty; every consumer works without them.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "topology/topology.hpp"

namespace pod_init {

// NCCL names every NVSwitch with this one bus id in its topology files.
inline constexpr const char* kNvSwitchTarget = "fffffff:ff:ff.0";

enum class NvLinkPeer { Gpu, Switch };

// Active links of one GPU that end at the same peer.
struct NvLinkGroup {
  std::string target;  // the peer GPU's BDF, or kNvSwitchTarget
  NvLinkPeer peer = NvLinkPeer::Gpu;
  int count = 0;
};

struct GpuDetails {
  int sm = 0;           // compute capability x10 (90 for H100/H200); 0: unknown
  double link_gbs = 0;  // one NVLink, one direction, GB/s; 0: unknown
  std::vector<NvLinkGroup> nvlinks;
};
using GpuDetailsMap = std::map<std::string, GpuDetails>;  // by GPU BDF

// Links usable between two GPUs: direct links, or through NVSwitches the
// smaller of the two GPUs' switch links (how `nvidia-smi topo -m` counts NV#).
int nvlinks_between(const std::string& a_bdf, const GpuDetails* a, const std::string& b_bdf,
                    const GpuDetails* b);

// Fills topo->matrix.nvlinks from `details` (GPU pairs only).
void merge_nvlinks(Topology* topo, const GpuDetailsMap& details);

}  // namespace pod_init
