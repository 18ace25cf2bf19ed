// Ring planning for NCCL: orders of GPUs whose slowest hop is as fast as
// possible, then with the fewest SYS, then NODE, then PHB crossings.
#pragma once

#include <vector>

#include "topology/nvlink.hpp"
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

inline constexpr int kExactRingLimit = 10;

RingCost ring_cost(const HopMatrix& hops, const std::vector<int>& order);
// Exact (bottleneck search, then Held-Karp over subsets) up to kExactRingLimit
// GPUs; beyond, nearest-neighbour from every start improved by 2-opt.
RingPlan plan_ring(const HopMatrix& hops);
// The heuristic alone, at any size: plan_ring() uses it past kExactRingLimit.
RingPlan plan_ring_heuristic(const HopMatrix& hops);
// Every order with GPU 0 first; for tests and for checking the exact search.
RingPlan plan_ring_brute_force(const HopMatrix& hops);

// GB/s one direction of a PCIe link carries: lanes x rate x encoding.
double pcie_link_gbs(double speed_gts, int width);
// Hops between the topology's GPUs: over NVLink where `details` (NVML) shows
// links, as many links as both ends share; else over PCIe at what the slower
// of the two GPU links carries.
HopMatrix gpu_hops(const Topology& topo, const GpuDetailsMap& details);

// A multi-node ring enters a node at its first GPU and leaves from its last:
// the cut of the cycle that puts both next to one NIC (rail alignment).
struct RailCut {
  int nic = -1;
  std::vector<int> order;    // the ring rotated so the cut hop closes it
  Level worst = Level::Sys;  // the farther of the two ends from the NIC
};

// For each NIC (columns of `gpu_to_nic`, one row per GPU), the rotation of
// `order` whose two ends are closest to that NIC: the farther end first, then
// both ends together; ties keep the earliest cut.
std::vector<RailCut> rail_cuts(const std::vector<int>& order,
                               const std::vector<std::vector<Level>>& gpu_to_nic);

}  // namespace pod_init
