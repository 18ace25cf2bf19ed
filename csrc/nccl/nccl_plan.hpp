// The values an NCCL configuration is made of, for every caller: the ring
// plan and its hops, the graph file's channels, the CPU NCCL is told of, and
// topology hints. The code that computes them stays in detail/.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "topology/topology.hpp"

namespace pod_init {

// One directed hop between two GPUs.
struct RingHop {
  double bandwidth_gbs = 0;  // what the hop can carry, GB/s
  Level level = Level::Sys;  // PCIe level between the two; ignored when nvlinks > 0
  int nvlinks = 0;           // > 0: the hop runs over NVLink and crosses no PCIe bridge
};
using HopMatrix = std::vector<std::vector<RingHop>>;

struct RingCost {
  double bottleneck_gbs = 0;
  int sys = 0, node = 0, phb = 0;
  // Lexicographic: a wider bottleneck first, then fewer SYS, NODE, PHB crossings.
  bool better_than(const RingCost& other) const;
  bool operator==(const RingCost& other) const;
};

struct RingPlan {
  std::vector<int> order;  // GPU indices; the ring closes from the last back to the first
  RingCost cost;
  bool exact = false;  // false: the heuristic answered (more than kExactRingLimit GPUs)
};

// A multi-node ring enters a node at its first GPU and leaves from its last:
// the cut of the cycle that puts both next to one NIC (rail alignment).
struct RailCut {
  int nic = -1;
  std::vector<int> order;    // the ring rotated so the cut hop closes it
  Level worst = Level::Sys;  // the farther of the two ends from the NIC
};

// The CPU attributes NCCL reads from a topology file to model the links
// between sockets (arch, vendor, family and model decide the SMP bandwidth).
struct CpuIdentity {
  std::string arch;    // x86_64, arm64, ppc64 (NCCL's spelling); "" unknown
  std::string vendor;  // GenuineIntel, AuthenticAMD, ...; x86 only
  int family = -1;
  int model = -1;
};

struct GraphChannel {
  int net = -1;           // entering and leaving NIC for multi-node rings; -1 single node
  std::vector<int> gpus;  // GPU indices (NVML order) in ring order
};

struct RingGraph {
  std::vector<GraphChannel> channels;
  double speed_intra_gbs = 0;  // per channel
  double speed_inter_gbs = 0;
  std::string type_intra;  // NVL, PIX, PXB, PHB, SYS: the worst hop
  std::string type_inter;  // the worst GPU-NIC path at ring ends; PIX single node
};

struct HintSwitch {
  std::string busid;  // made up, like vendors' files: ffff:ff:NN.0
  std::vector<std::string> members;
  int line = 0;
};

struct TopoHints {
  std::vector<HintSwitch> switches;
  std::map<std::string, int> numa;       // BDF -> NUMA node
  std::map<std::string, int> numa_line;  // BDF -> the line that placed it
  bool empty() const { return switches.empty() && numa.empty(); }
};

}  // namespace pod_init
