// Ring planning for NCCL: orders of GPUs whose slowest hop is as fast as
// possible, then with the fewest SYS, then NODE, then PHB crossings.
#pragma once

#include <vector>

#include "nccl/nccl_plan.hpp"
#include "topology/nvlink.hpp"
#include "topology/topology.hpp"

namespace pod_init {

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

// For each NIC (columns of `gpu_to_nic`, one row per GPU), the rotation of
// `order` whose two ends are closest to that NIC: the farther end first, then
// both ends together; ties keep the earliest cut.
std::vector<RailCut> rail_cuts(const std::vector<int>& order,
                               const std::vector<std::vector<Level>>& gpu_to_nic);

}  // namespace pod_init
