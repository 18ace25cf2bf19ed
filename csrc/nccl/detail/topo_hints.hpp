// Topology hints: a small file that regroups devices a VM shows flat (one root
// bus, NUMA -1) under the PCIe switches and NUMA nodes they really sit on, the
// way vendors' hand-written NCCL topology files do.
//
//   # comment
//   numa 0 0000:00:06.0 0000:00:03.0     these devices belong to NUMA node 0
//   switch 0000:00:06.0 0000:00:07.0     these devices share one PCIe switch
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/line_input.hpp"
#include "nccl/nccl_plan.hpp"
#include "topology/topology.hpp"

namespace pod_init {

inline constexpr int kMaxHintSwitches = 32;

// Syntax only; returns 0 or -EINVAL with `error`.
int parse_topo_hints(std::string_view text, TopoHints* hints, LineError* error);

// Every BDF must be a GPU or NIC of `devices`, and a switch's members must not
// be placed on different NUMA nodes. Returns 0 or -EINVAL with `error`.
int check_topo_hints(const TopoHints& hints, const std::vector<PciDevice>& devices,
                     LineError* error);

// Rewrites the devices' placement (NUMA node, upstream chain), adds one bridge
// per hinted switch and rebuilds the matrix, so rings and the NCCL file both
// see the hinted tree. Call after check_topo_hints().
void apply_topo_hints(const TopoHints& hints, Topology* topo);

}  // namespace pod_init
