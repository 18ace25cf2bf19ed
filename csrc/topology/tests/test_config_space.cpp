#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "topology/config_space.hpp"

namespace pod_init {
namespace {

// A switch downstream port: PCIe capability at 0x60 behind a PM capability,
// AER then ACS in extended space.
std::vector<uint8_t> downstream_port(uint16_t acs_control) {
  std::vector<uint8_t> cfg(4096, 0);
  auto put16 = [&](unsigned off, uint16_t v) { std::memcpy(&cfg[off], &v, 2); };
  auto put32 = [&](unsigned off, uint32_t v) { std::memcpy(&cfg[off], &v, 4); };
  put16(0x06, 0x0010);
  cfg[0x34] = 0x40;
  cfg[0x40] = 0x01;
  cfg[0x41] = 0x60;
  cfg[0x60] = 0x10;
  put16(0x62, (6 << 4) | 2);
  put32(0x6c, 5 | (16 << 4));  // Gen5 x16 capable
  put16(0x72, 3 | (8 << 4));   // trained Gen3 x8
  put32(0x100, 0x0001 | (1 << 16) | (0x148u << 20));
  put32(0x148, 0x000d | (1 << 16));
  put16(0x14c, 0x005f);
  put16(0x14e, acs_control);
  return cfg;
}

TEST(ConfigSpace, ReadsPortTypeLinkAndAcs) {
  auto cfg = downstream_port(0x001d);
  ConfigInfo info = parse_config(BufferConfigAccess(cfg.data(), cfg.size()));
  ASSERT_TRUE(info.header_readable);
  ASSERT_TRUE(info.port_type.has_value());
  EXPECT_EQ(*info.port_type, PortType::SwitchDownstream);
  ASSERT_TRUE(info.link.has_value());
  EXPECT_EQ(info.link->max_speed_code, 5);
  EXPECT_EQ(info.link->max_width, 16);
  EXPECT_EQ(info.link->speed_code, 3);
  EXPECT_EQ(info.link->width, 8);
  ASSERT_TRUE(info.acs.has_value());
  EXPECT_EQ(info.acs->capability, 0x005f);
  EXPECT_EQ(info.acs->control, 0x001d);
  EXPECT_TRUE(info.acs->redirects_peer_traffic());
}

TEST(ConfigSpace, AcsWithOnlySourceValidationDoesNotRedirect) {
  auto cfg = downstream_port(AcsRegisters::kSourceValidation | AcsRegisters::kUpstreamForwarding);
  ConfigInfo info = parse_config(BufferConfigAccess(cfg.data(), cfg.size()));
  ASSERT_TRUE(info.acs.has_value());
  EXPECT_FALSE(info.acs->redirects_peer_traffic());
}

TEST(ConfigSpace, UnprivilegedReadSeesHeaderOnly) {
  auto cfg = downstream_port(0x1d);
  ConfigInfo info = parse_config(BufferConfigAccess(cfg.data(), 64));
  EXPECT_TRUE(info.header_readable);
  EXPECT_FALSE(info.port_type.has_value());  // capability at 0x60 is past 64 bytes
  EXPECT_FALSE(info.extended_readable);
  EXPECT_FALSE(info.acs.has_value());
}

TEST(ConfigSpace, ConventionalSpaceHasNoExtendedCapabilities) {
  auto cfg = downstream_port(0x1d);
  ConfigInfo info = parse_config(BufferConfigAccess(cfg.data(), 256));
  EXPECT_TRUE(info.port_type.has_value());
  EXPECT_FALSE(info.extended_readable);
  EXPECT_FALSE(info.acs.has_value());
}

TEST(ConfigSpace, CapabilityLoopsTerminate) {
  auto cfg = downstream_port(0x1d);
  cfg[0x41] = 0x40;  // PM capability points at itself: the PCIe capability is unreachable
  uint32_t ext_self_loop = 0x0001 | (1 << 16) | (0x100u << 20);
  std::memcpy(&cfg[0x100], &ext_self_loop, 4);
  ConfigInfo info = parse_config(BufferConfigAccess(cfg.data(), cfg.size()));
  EXPECT_FALSE(info.port_type.has_value());
  cfg[0x41] = 0x60;
  info = parse_config(BufferConfigAccess(cfg.data(), cfg.size()));
  EXPECT_TRUE(info.port_type.has_value());
  EXPECT_FALSE(info.acs.has_value());
}

TEST(ConfigSpace, TruncatedSpaceIsUnreadable) {
  auto cfg = downstream_port(0);
  ConfigInfo info = parse_config(BufferConfigAccess(cfg.data(), 10));
  EXPECT_FALSE(info.header_readable);
  EXPECT_FALSE(info.port_type.has_value());
}

TEST(LinkSpeed, CodesAndGenerations) {
  EXPECT_EQ(*link_speed_from_code(1), 2.5);
  EXPECT_EQ(*link_speed_from_code(5), 32.0);
  EXPECT_FALSE(link_speed_from_code(0).has_value());
  EXPECT_FALSE(link_speed_from_code(7).has_value());
  EXPECT_EQ(link_generation(16.0), 4);
  EXPECT_EQ(link_generation(64.0), 6);
  EXPECT_EQ(link_generation(3.0), 0);
  EXPECT_EQ(format_link_speed(2.5), "2.5 GT/s");
  EXPECT_EQ(format_link_speed(32.0), "32 GT/s");
}

}  // namespace
}  // namespace pod_init
