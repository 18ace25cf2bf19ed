// NCCL's XML files: the topology file (NCCL_TOPO_FILE) describing this node's
// PCIe tree, and the graph file (NCCL_GRAPH_FILE) holding ring channels.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "nccl/nccl_plan.hpp"
#include "topology/nvlink.hpp"
#include "topology/topology.hpp"

namespace pod_init {

CpuIdentity parse_cpuinfo(std::string_view text);

// "0-3,8" -> "0000010f": the kernel's cpumap format, 32-bit words from the
// highest, as NCCL's affinity attribute expects. "" for an empty or bad list.
std::string cpulist_to_mask(std::string_view cpulist);

// "32.0 GT/s PCIe": the sysfs spelling that NCCL maps to a bandwidth.
std::string nccl_link_speed(double speed_gts);

struct TopoXmlOptions {
  CpuIdentity cpu;
  int first_rank = 0;            // this node's first global rank (node rank x GPUs)
  bool gpudirect_known = false;  // nvidia-peermem is loaded: write gdr="1"
};

// <system>/<cpu>/<pci switch>.../<pci><gpu|nic>: GPUs and NICs under the
// switches and NUMA nodes the topology (after hints) puts them. Attributes
// NCCL can detect better itself (sm without NVML, net speed) are left out.
std::string nccl_topo_xml(const Topology& topo, const GpuDetailsMap& details,
                          const TopoXmlOptions& options);

// The NIC names NCCL will know the topology's NICs by (IB device, else
// interface), in the order the graph file's `net dev` numbers them.
std::vector<std::string> nccl_net_names(const Topology& topo);

// <graphs><graph id="0" pattern="4" ...><channel>...: NCCL's ring graph.
std::string nccl_graph_xml(const RingGraph& graph);

}  // namespace pod_init
