// Checks over a scanned topology: degraded links, small BAR1, ACS redirect on
// peer paths, unknown NUMA placement, missing GPUs, unreadable config space.
#pragma once

#include <cstdint>
#include <vector>

#include "topology/findings.hpp"
#include "topology/topology.hpp"

namespace pod_init {

constexpr uint64_t kMinBar1Bytes = 1ull << 30;

void check_links(const std::vector<PciDevice>& devices, const DeviceIndex& index,
                 std::vector<Finding>* findings);
void check_bar1(const std::vector<PciDevice>& devices, std::vector<Finding>* findings);
void check_acs(const std::vector<PciDevice>& devices, const DeviceIndex& index,
               std::vector<Finding>* findings);
void check_numa(const std::vector<PciDevice>& devices, int numa_nodes,
                std::vector<Finding>* findings);
// Says once when bridges' config space could not be read past the header (an
// unprivileged scan), since switch grouping then falls back to the heuristic.
void check_config_access(const std::vector<PciDevice>& devices, std::vector<Finding>* findings);
void check_gpu_count(const std::vector<PciDevice>& devices, int expect_gpus,
                     std::vector<Finding>* findings);

}  // namespace pod_init
