#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "common/crc32c.hpp"
#include "common/tests/crc32c_checks.hpp"

namespace pod_init {
namespace {

TEST(Crc32c, KnownValue) {
  // The check value of CRC-32C: the CRC of the ASCII digits 1 to 9.
  EXPECT_EQ(crc32c(0, "123456789", 9), 0xE3069283u);
}

TEST(Crc32c, EveryLengthAndStartMatchesTheDefinition) {
  std::mt19937 random(11);
  std::vector<uint8_t> data((1 << 20) + 64);
  for (uint8_t& byte : data) byte = static_cast<uint8_t>(random());
  std::vector<size_t> lengths;
  for (size_t n = 0; n < 100; ++n) lengths.push_back(n);
  // Around the short (3 x 256) and long (3 x 8192) rounds and their sums.
  for (size_t edge : {size_t{768}, size_t{1536}, size_t{24576}, size_t{24576 + 768}, size_t{49152},
                      size_t{1} << 20})
    for (size_t n : {edge - 9, edge - 1, edge, edge + 1, edge + 7, edge + 8}) lengths.push_back(n);
  // Around the folds' rounds (256 bytes) and what they leave to the lanes.
  for (size_t edge : {size_t{256}, size_t{512}, size_t{256 + 768}, size_t{4096 + 24576 + 768}})
    for (size_t n : {edge - 1, edge, edge + 1, edge + 15, edge + 16, edge + 255})
      lengths.push_back(n);
  EXPECT_EQ(crc32c_first_mismatch(data, {0, 1, 3, 8, 13, 64}, lengths), "");
}

TEST(Crc32c, TheChosenMethodIsTheLastTheCpuRuns) {
  const std::vector<Crc32cMethod> methods = crc32c_methods();
  ASSERT_FALSE(methods.empty());
  EXPECT_EQ(methods.front(), Crc32cMethod::kTable);
  const std::vector<uint8_t> data(1000, 0x5A);
  EXPECT_EQ(crc32c(0, data.data(), data.size()),
            crc32c_by(methods.back(), 0, data.data(), data.size()));
  // Printed so a run on a machine shows what it tested.
  std::printf("crc32c methods this CPU runs: %zu (the last is used)\n", methods.size());
}

TEST(Crc32c, CombinedPartsEqualTheWhole) {
  std::mt19937 random(7);
  std::vector<uint8_t> data(3 << 20);
  for (uint8_t& byte : data) byte = static_cast<uint8_t>(random());
  for (size_t split : {size_t{0}, size_t{1}, size_t{7}, size_t{4096}, size_t{1} << 20,
                       data.size() - 3, data.size()}) {
    uint32_t first = crc32c(0, data.data(), split);
    uint32_t second = crc32c(0, data.data() + split, data.size() - split);
    EXPECT_EQ(crc32c_combine(first, second, data.size() - split),
              crc32c(0, data.data(), data.size()))
        << "split at " << split;
  }
}

}  // namespace
}  // namespace pod_init
