#include <gtest/gtest.h>

#include "topology/topology.hpp"

namespace pod_init {
namespace {

PciDevice make(const std::string& bdf, const std::string& root_bus,
               std::vector<std::string> upstream, int numa = 0) {
  PciDevice dev;
  dev.bdf = bdf;
  dev.root_bus = root_bus;
  dev.upstream = std::move(upstream);
  dev.numa_node = numa;
  dev.kind = DeviceKind::Gpu;
  return dev;
}

// Bridges unknown to the index: switch grouping falls back to chain position.
const DeviceIndex kNoBridges;

TEST(Classify, LevelsByChainPosition) {
  auto a = make("0000:03:00.0", "pci0000:00", {"0000:00:01.0", "0000:01:00.0", "0000:02:00.0"});
  auto b = make("0000:04:00.0", "pci0000:00", {"0000:00:01.0", "0000:01:00.0", "0000:02:01.0"});
  auto deep =
      make("0000:06:00.0", "pci0000:00",
           {"0000:00:01.0", "0000:01:00.0", "0000:02:02.0", "0000:05:00.0", "0000:06:00.0"});
  auto other_rp = make("0000:10:00.0", "pci0000:00", {"0000:00:02.0"});
  auto other_host = make("0000:21:00.0", "pci0000:20", {"0000:20:01.0"});
  auto other_socket = make("0000:81:00.0", "pci0000:80", {"0000:80:01.0"}, 1);
  EXPECT_EQ(classify(a, a, kNoBridges), Level::Self);
  EXPECT_EQ(classify(a, b, kNoBridges), Level::Pix);
  EXPECT_EQ(classify(a, deep, kNoBridges), Level::Pxb);
  EXPECT_EQ(classify(a, other_rp, kNoBridges), Level::Phb);
  EXPECT_EQ(classify(a, other_host, kNoBridges), Level::Node);
  EXPECT_EQ(classify(a, other_socket, kNoBridges), Level::Sys);
  EXPECT_EQ(classify(other_socket, a, kNoBridges), Level::Sys);
}

TEST(Classify, UnknownNumaNeverClaimsSys) {
  auto a = make("0000:03:00.0", "pci0000:00", {}, -1);
  auto b = make("0000:81:00.0", "pci0000:80", {}, 1);
  EXPECT_EQ(classify(a, b, kNoBridges), Level::Node);
}

TEST(Classify, FunctionsOfOneDeviceAreOneSwitchApart) {
  auto port0 = make("0000:1e:00.0", "pci0000:17", {"0000:17:01.0"});
  auto port1 = make("0000:1e:00.1", "pci0000:17", {"0000:17:01.0"});
  EXPECT_EQ(classify(port0, port1, kNoBridges), Level::Pix);
}

TEST(Classify, FlatVmRootBusIsHostBridge) {
  // An H200 VM: both GPUs on the root bus; NVML reports 30 (host bridge).
  auto gpu0 = make("0000:00:06.0", "pci0000:00", {}, -1);
  auto gpu1 = make("0000:00:07.0", "pci0000:00", {}, -1);
  EXPECT_EQ(classify(gpu0, gpu1, kNoBridges), Level::Phb);
  EXPECT_EQ(static_cast<int>(Level::Phb), 30);
}

TEST(Classify, ConfigPortTypesOverrideThePositionHeuristic) {
  // A root port with a switch whose upstream port sits directly below it, but
  // whose downstream ports are themselves upstream ports of a second switch:
  // config space says so, position alone would group them wrongly.
  std::vector<PciDevice> bridges;
  auto bridge = [&](const std::string& bdf, PortType type) {
    PciDevice dev = make(bdf, "pci0000:00", {});
    dev.kind = DeviceKind::Bridge;
    dev.config.port_type = type;
    bridges.push_back(dev);
  };
  bridge("0000:00:01.0", PortType::RootPort);
  bridge("0000:01:00.0", PortType::SwitchUpstream);
  bridge("0000:02:00.0", PortType::SwitchDownstream);
  bridge("0000:02:01.0", PortType::SwitchDownstream);
  DeviceIndex index = index_by_bdf(bridges);
  std::vector<std::string> chain = {"0000:00:01.0", "0000:01:00.0", "0000:02:00.0"};
  EXPECT_EQ(switch_of(chain, 0, index), "");
  EXPECT_EQ(switch_of(chain, 1, index), "0000:01:00.0");
  EXPECT_EQ(switch_of(chain, 2, index), "0000:01:00.0");
  auto a = make("0000:03:00.0", "pci0000:00", chain);
  auto b = make("0000:04:00.0", "pci0000:00", {"0000:00:01.0", "0000:01:00.0", "0000:02:01.0"});
  EXPECT_EQ(classify(a, b, index), Level::Pix);
}

TEST(BridgesBetween, PathBelowTheDeepestCommonBridge) {
  auto a = make("0000:03:00.0", "pci0000:00", {"0000:00:01.0", "0000:01:00.0", "0000:02:00.0"});
  auto b = make("0000:04:00.0", "pci0000:00", {"0000:00:01.0", "0000:01:00.0", "0000:02:01.0"});
  std::vector<std::string> expected = {"0000:01:00.0", "0000:02:00.0", "0000:02:01.0"};
  EXPECT_EQ(bridges_between(a, b), expected);
  auto c = make("0000:21:00.0", "pci0000:20", {"0000:20:01.0"});
  std::vector<std::string> across = {"0000:00:01.0", "0000:01:00.0", "0000:02:00.0",
                                     "0000:20:01.0"};
  EXPECT_EQ(bridges_between(a, c), across);
}

}  // namespace
}  // namespace pod_init
