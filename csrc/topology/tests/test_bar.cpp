#include <gtest/gtest.h>

#include "topology/bar.hpp"

namespace pod_init {
namespace {

constexpr const char* kZero = "0x0000000000000000 0x0000000000000000 0x0000000000000000\n";

TEST(Resource, VmLayoutPutsBar1AtResource2) {
  // An H200 VM, as its sysfs reads.
  std::string text = std::string("0x0000104002000000 0x0000104002ffffff 0x000000000014220c\n") +
                     kZero + "0x0000100000000000 0x0000103fffffffff 0x000000000014220c\n" + kZero +
                     "0x0000104000000000 0x0000104001ffffff 0x000000000014220c\n" + kZero + kZero;
  std::vector<Bar> bars;
  ASSERT_EQ(parse_resource(text, &bars), 0);
  ASSERT_EQ(bars.size(), 3u);
  EXPECT_EQ(bars[0].index, 0);
  EXPECT_EQ(bars[0].size, 16ull << 20);
  EXPECT_TRUE(bars[0].is_64bit);
  EXPECT_TRUE(bars[0].prefetchable);
  const Bar* bar1 = nvidia_bar1(bars);
  ASSERT_NE(bar1, nullptr);
  EXPECT_EQ(bar1->index, 2);
  EXPECT_EQ(bar1->size, 256ull << 30);
}

TEST(Resource, BareMetalLayoutPutsBar1AtResource1) {
  std::string text = std::string("0x0000000090000000 0x0000000090ffffff 0x0000000000040200\n") +
                     "0x0000200000000000 0x0000201fffffffff 0x000000000014220c\n" + kZero +
                     "0x0000202000000000 0x0000202001ffffff 0x000000000014220c\n" + kZero + kZero;
  std::vector<Bar> bars;
  ASSERT_EQ(parse_resource(text, &bars), 0);
  ASSERT_EQ(bars.size(), 3u);
  EXPECT_FALSE(bars[0].is_64bit);
  EXPECT_FALSE(bars[0].prefetchable);
  const Bar* bar1 = nvidia_bar1(bars);
  ASSERT_NE(bar1, nullptr);
  EXPECT_EQ(bar1->index, 1);
  EXPECT_EQ(bar1->size, 128ull << 30);
}

TEST(Resource, IoBarsDoNotCountTowardsBar1) {
  std::string text = std::string("0x000000000000c000 0x000000000000c07f 0x0000000000040101\n") +
                     "0x0000000090000000 0x0000000090ffffff 0x0000000000040200\n";
  std::vector<Bar> bars;
  ASSERT_EQ(parse_resource(text, &bars), 0);
  ASSERT_EQ(bars.size(), 2u);
  EXPECT_TRUE(bars[0].is_io);
  EXPECT_EQ(nvidia_bar1(bars), nullptr);
}

TEST(Resource, MalformedLinesAreRejected) {
  std::vector<Bar> bars;
  EXPECT_EQ(parse_resource("0x1000 0x1fff\n", &bars), -EINVAL);
  EXPECT_EQ(parse_resource("zz 0x1fff 0x200\n", &bars), -EINVAL);
  EXPECT_EQ(parse_resource("0x2000 0x1000 0x200\n", &bars), -EINVAL);
  EXPECT_EQ(parse_resource("", &bars), 0);
  EXPECT_TRUE(bars.empty());
}

TEST(Boot0, DecodesKnownChips) {
  ChipId h100 = decode_boot0(0x180000a1);
  EXPECT_EQ(h100.chip, "GH100");
  EXPECT_EQ(h100.architecture, "Hopper");
  ChipId a100 = decode_boot0(0x170000a1);
  EXPECT_EQ(a100.chip, "GA100");
  EXPECT_EQ(a100.architecture, "Ampere");
  ChipId ada = decode_boot0(0x192000a1);
  EXPECT_EQ(ada.chip, "AD102");
  EXPECT_EQ(ada.architecture, "Ada");
  ChipId unknown = decode_boot0(0x1f5000a1);
  EXPECT_EQ(unknown.chip, "");
  EXPECT_EQ(unknown.architecture, "");
}

TEST(BarSize, HumanUnits) {
  EXPECT_EQ(format_bar_size(256ull << 30), "256 GiB");
  EXPECT_EQ(format_bar_size(32ull << 20), "32 MiB");
  EXPECT_EQ(format_bar_size(16384), "16 KiB");
}

}  // namespace
}  // namespace pod_init
