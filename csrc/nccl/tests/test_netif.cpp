#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

#include "nccl/netif.hpp"

namespace pod_init {
namespace {

TEST(Netif, ContainerBridgesHaveNoPhysicalPort) {
  char pattern[] = "/tmp/netif-XXXXXX";
  std::string root = mkdtemp(pattern);
  for (const char* dir : {"/br0/bridge", "/br0/brif/eth0", "/eth0/device", "/docker0/bridge",
                          "/docker0/brif/veth1", "/veth1", "/cni0/bridge"}) {
    std::filesystem::create_directories(root + dir);
  }
  EXPECT_FALSE(is_container_bridge("br0", root));     // host bridge over the NIC
  EXPECT_TRUE(is_container_bridge("docker0", root));  // veths only
  EXPECT_TRUE(is_container_bridge("cni0", root));     // no port list at all
  EXPECT_FALSE(is_container_bridge("eth0", root));    // not a bridge
  EXPECT_FALSE(is_container_bridge("missing0", root));
  std::filesystem::remove_all(root);
}

TEST(Netif, AddressesIncludeLoopback) {
  std::vector<InterfaceAddress> addresses;
  ASSERT_EQ(interface_addresses(&addresses), 0);
  bool loopback = false;
  for (const auto& entry : addresses)
    loopback |= entry.interface == "lo" && entry.address == "127.0.0.1";
  EXPECT_TRUE(loopback);
}

TEST(Netif, LoopbackRoutesThroughLo) {
  std::string interface, source;
  ASSERT_EQ(route_interface("127.0.0.2", &interface, &source), 0);
  EXPECT_EQ(interface, "lo");
  EXPECT_EQ(source, "127.0.0.1");
  EXPECT_EQ(route_interface("not an address", &interface, &source), -EINVAL);
  EXPECT_TRUE(interface_exists("lo"));
  EXPECT_FALSE(interface_exists("nosuch0"));
}

}  // namespace
}  // namespace pod_init
