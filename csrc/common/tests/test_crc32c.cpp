#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "common/crc32c.hpp"

namespace pod_init {
namespace {

TEST(Crc32c, KnownValue) {
  // The check value of CRC-32C: the CRC of the ASCII digits 1 to 9.
  EXPECT_EQ(crc32c(0, "123456789", 9), 0xE3069283u);
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
