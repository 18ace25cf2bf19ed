#include <gtest/gtest.h>

#include "common/sysfs.hpp"

namespace pod_init::sysfs {
namespace {

TEST(Parse, Numbers) {
  EXPECT_EQ(parse_hex("0x10de"), 0x10deu);
  EXPECT_EQ(parse_hex("030200"), 0x030200u);
  EXPECT_FALSE(parse_hex("zzz").has_value());
  EXPECT_FALSE(parse_hex("").has_value());
  EXPECT_FALSE(parse_hex("-1").has_value());
  // strtoull skips leading whitespace: a number never starts with it.
  EXPECT_FALSE(parse_hex(" 10de").has_value());
  EXPECT_FALSE(parse_int(" 5").has_value());
  EXPECT_FALSE(parse_int("\t5").has_value());
  EXPECT_FALSE(parse_int("- 5").has_value());
  EXPECT_EQ(parse_int("-1"), -1);
  EXPECT_EQ(parse_int("16"), 16);
  EXPECT_FALSE(parse_int("16x").has_value());
  EXPECT_FALSE(parse_int("").has_value());
}

TEST(Parse, LinkSpeeds) {
  EXPECT_EQ(parse_link_speed("32.0 GT/s PCIe"), 32.0);
  EXPECT_EQ(parse_link_speed("8 GT/s"), 8.0);
  EXPECT_EQ(parse_link_speed("2.5 GT/s PCIe"), 2.5);
  EXPECT_FALSE(parse_link_speed("Unknown").has_value());
  EXPECT_FALSE(parse_link_speed("fast").has_value());
  EXPECT_FALSE(parse_link_speed(" GT/s").has_value());
}

TEST(Paths, BdfRecognition) {
  EXPECT_TRUE(is_bdf("0000:00:06.0"));
  EXPECT_TRUE(is_bdf("10000:e1:00.7"));  // VMD domain
  EXPECT_FALSE(is_bdf("0000:00:06.8"));
  EXPECT_FALSE(is_bdf("pci0000:00"));
  EXPECT_FALSE(is_bdf("0000:00:06"));
  EXPECT_FALSE(is_bdf("0000:0G:06.0"));
  EXPECT_EQ(last_bdf_component("/devices/pci0000:00/0000:00:03.0/virtio2/net/eth0"),
            "0000:00:03.0");
  EXPECT_EQ(last_bdf_component("/devices/virtual/net/lo"), "");
}

TEST(Paths, Normalize) {
  EXPECT_EQ(normalize_path("/sys/bus/pci/devices/../../../devices/pci0000:00/./x"),
            "/sys/devices/pci0000:00/x");
  EXPECT_EQ(normalize_path("/../.."), "/");
  EXPECT_EQ(normalize_path("a//b/"), "/a/b");
  EXPECT_EQ(basename("/a/b/nvidia"), "nvidia");
}

}  // namespace
}  // namespace pod_init::sysfs
