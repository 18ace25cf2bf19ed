#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "nccl/detail/rings.hpp"

namespace pod_init {
namespace {

HopMatrix random_hops(int n, std::mt19937& rng) {
  const Level levels[] = {Level::Pix, Level::Pxb, Level::Phb, Level::Node, Level::Sys};
  const double bandwidths[] = {12.5, 25.0, 31.5, 63.0};
  HopMatrix hops(n, std::vector<RingHop>(n));
  for (int a = 0; a < n; ++a) {
    for (int b = a + 1; b < n; ++b) {
      RingHop hop;
      hop.level = levels[rng() % 5];
      hop.bandwidth_gbs = bandwidths[rng() % 4];
      hop.nvlinks = rng() % 6 == 0 ? 4 : 0;
      hops[a][b] = hops[b][a] = hop;
    }
  }
  return hops;
}

bool is_permutation_of_all(const std::vector<int>& order, int n) {
  std::vector<int> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < n; ++i) {
    if (i >= static_cast<int>(sorted.size()) || sorted[i] != i) return false;
  }
  return static_cast<int>(sorted.size()) == n;
}

TEST(Rings, ExactSearchEqualsBruteForce) {
  std::mt19937 rng(20261130);
  for (int n = 2; n <= 8; ++n) {
    for (int trial = 0; trial < 40; ++trial) {
      HopMatrix hops = random_hops(n, rng);
      RingPlan exact = plan_ring(hops);
      RingPlan brute = plan_ring_brute_force(hops);
      ASSERT_TRUE(exact.exact);
      ASSERT_TRUE(is_permutation_of_all(exact.order, n));
      EXPECT_EQ(exact.order.front(), 0);
      EXPECT_TRUE(exact.cost == brute.cost) << "n=" << n << " trial=" << trial;
      EXPECT_TRUE(ring_cost(hops, exact.order) == exact.cost);
    }
  }
}

TEST(Rings, HeuristicIsAValidRingNeverBetterThanExact) {
  std::mt19937 rng(7);
  int matched = 0, total = 0;
  for (int n = 3; n <= 8; ++n) {
    for (int trial = 0; trial < 20; ++trial, ++total) {
      HopMatrix hops = random_hops(n, rng);
      RingPlan heuristic = plan_ring_heuristic(hops);
      RingPlan exact = plan_ring(hops);
      ASSERT_TRUE(is_permutation_of_all(heuristic.order, n));
      EXPECT_FALSE(heuristic.exact);
      EXPECT_FALSE(heuristic.cost.better_than(exact.cost));
      matched += heuristic.cost == exact.cost;
    }
  }
  // Nearest neighbour plus 2-opt finds the optimum on most small random cases.
  EXPECT_GE(matched * 10, total * 8) << matched << " of " << total;
}

// The 8-GPU two-socket fixture (tests/sysfs_fixtures.py build_8gpu): host
// bridges {0,1} {2,3} on socket 0, {4,5} {6,7} on socket 1; GPU4 trained x8.
HopMatrix eight_gpu_box() {
  const int host_bridge[] = {0, 0, 1, 1, 2, 2, 3, 3};
  const double x16 = pcie_link_gbs(32.0, 16), x8 = pcie_link_gbs(32.0, 8);
  HopMatrix hops(8, std::vector<RingHop>(8));
  for (int a = 0; a < 8; ++a) {
    for (int b = 0; b < 8; ++b) {
      bool same_socket = host_bridge[a] / 2 == host_bridge[b] / 2;
      hops[a][b].level = host_bridge[a] == host_bridge[b] ? Level::Pix
                         : same_socket                    ? Level::Node
                                                          : Level::Sys;
      hops[a][b].bandwidth_gbs = (a == 4 || b == 4) ? x8 : x16;
    }
  }
  return hops;
}

TEST(Rings, EightGpuBoxCrossesSocketsTwiceAndHostBridgesMinimally) {
  HopMatrix hops = eight_gpu_box();
  for (const RingPlan& plan : {plan_ring(hops), plan_ring_heuristic(hops)}) {
    EXPECT_EQ(plan.cost.sys, 2);
    EXPECT_EQ(plan.cost.node, 2);  // one move between the host bridges of each socket
    EXPECT_EQ(plan.cost.phb, 0);
    EXPECT_DOUBLE_EQ(plan.cost.bottleneck_gbs, pcie_link_gbs(32.0, 8));
  }
}

TEST(Rings, NvlinkHopsBeatPcieCrossings) {
  // Two GPUs per socket, every pair NVLinked: no crossing counts at all.
  HopMatrix hops(4, std::vector<RingHop>(4, RingHop{450.0, Level::Sys, 18}));
  RingPlan plan = plan_ring(hops);
  EXPECT_EQ(plan.cost.sys + plan.cost.node + plan.cost.phb, 0);
  EXPECT_DOUBLE_EQ(plan.cost.bottleneck_gbs, 450.0);
}

TEST(Rings, LargeRingsUseTheHeuristic) {
  std::mt19937 rng(3);
  HopMatrix hops = random_hops(12, rng);
  RingPlan plan = plan_ring(hops);
  EXPECT_FALSE(plan.exact);
  EXPECT_TRUE(is_permutation_of_all(plan.order, 12));
}

TEST(Rings, PcieBandwidth) {
  EXPECT_NEAR(pcie_link_gbs(32.0, 16), 63.0, 0.1);
  EXPECT_NEAR(pcie_link_gbs(16.0, 16), 31.5, 0.1);
  EXPECT_NEAR(pcie_link_gbs(2.5, 1), 0.25, 1e-9);
}

}  // namespace
}  // namespace pod_init

namespace pod_init {
namespace {

TEST(Rings, HopsFromATopology) {
  Topology topo;
  auto gpu = [](const std::string& bdf, const std::string& root_bus, int width) {
    PciDevice dev;
    dev.bdf = bdf;
    dev.kind = DeviceKind::Gpu;
    dev.root_bus = root_bus;
    dev.numa_node = 0;
    dev.link.speed_gts = 32.0;
    dev.link.width = width;
    return dev;
  };
  topo.devices = {gpu("0000:03:00.0", "pci0000:00", 16), gpu("0000:83:00.0", "pci0000:80", 8)};
  topo.devices.push_back(PciDevice{});  // not a GPU: left out
  HopMatrix hops = gpu_hops(topo, {});
  ASSERT_EQ(hops.size(), 2u);
  EXPECT_EQ(hops[0][1].level, Level::Node);
  EXPECT_DOUBLE_EQ(hops[0][1].bandwidth_gbs, pcie_link_gbs(32.0, 8));
  EXPECT_EQ(hops[1][1].level, Level::Self);
  EXPECT_EQ(hops[0][1].nvlinks, 0);

  // NVML shows both GPUs on NVSwitches: the hop runs over the shared links.
  GpuDetailsMap details;
  details["0000:03:00.0"] = {90, 26.5, {{kNvSwitchTarget, NvLinkPeer::Switch, 18}}};
  details["0000:83:00.0"] = {90, 26.5, {{kNvSwitchTarget, NvLinkPeer::Switch, 12}}};
  hops = gpu_hops(topo, details);
  EXPECT_EQ(hops[0][1].nvlinks, 12);
  EXPECT_DOUBLE_EQ(hops[0][1].bandwidth_gbs, 12 * 26.5);
  EXPECT_EQ(hops[0][0].nvlinks, 0);
}

TEST(Rings, DirectNvLinksCountFromEitherSide) {
  GpuDetails a{80, 25, {{"0000:02:00.0", NvLinkPeer::Gpu, 4}}};
  GpuDetails b{80, 25, {}};
  EXPECT_EQ(nvlinks_between("0000:01:00.0", &a, "0000:02:00.0", &b), 4);
  EXPECT_EQ(nvlinks_between("0000:02:00.0", &b, "0000:01:00.0", &a), 4);
  EXPECT_EQ(nvlinks_between("0000:01:00.0", &a, "0000:03:00.0", &b), 0);
  EXPECT_EQ(nvlinks_between("0000:01:00.0", &a, "0000:02:00.0", nullptr), 0);
}

TEST(Rings, RailCutsPutBothEndsNextToEachNic) {
  // Ring 0-1-2-3; NIC0 shares a switch with GPUs 2 and 3, NIC1 with GPUs 0 and 1.
  std::vector<std::vector<Level>> gpu_to_nic = {{Level::Sys, Level::Pix},
                                                {Level::Sys, Level::Pix},
                                                {Level::Pix, Level::Sys},
                                                {Level::Pix, Level::Sys}};
  std::vector<RailCut> cuts = rail_cuts({0, 1, 2, 3}, gpu_to_nic);
  ASSERT_EQ(cuts.size(), 2u);
  EXPECT_EQ(cuts[0].order, (std::vector<int>{3, 0, 1, 2}));  // enters at 3, leaves from 2
  EXPECT_EQ(cuts[0].worst, Level::Pix);
  EXPECT_EQ(cuts[1].order, (std::vector<int>{1, 2, 3, 0}));
  EXPECT_EQ(cuts[1].worst, Level::Pix);

  // A NIC no GPU pair sits next to: the best it can do, reported as such.
  cuts = rail_cuts({0, 2, 1, 3}, {{Level::Pix}, {Level::Pix}, {Level::Sys}, {Level::Sys}});
  EXPECT_EQ(cuts[0].worst, Level::Sys);
  EXPECT_EQ(cuts[0].order.size(), 4u);
}

}  // namespace
}  // namespace pod_init
