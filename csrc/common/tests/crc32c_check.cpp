// Every CRC-32C method the CPU runs against the definition, with no test
// framework: what a cross-built test runs under an emulated CPU of another
// architecture. Prints the methods it checked; exits 1 on the first wrong
// value.
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/crc32c.hpp"
#include "common/tests/crc32c_checks.hpp"

int main() {
  std::mt19937 random(5);
  std::vector<uint8_t> data(100000);
  for (uint8_t& byte : data) byte = static_cast<uint8_t>(random());
  // Every length to 800 (the short lanes' rounds and what they leave), then
  // past the long lanes' 3 x 8192.
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 800; ++n) lengths.push_back(n);
  for (size_t n : {24575, 24576, 24577, 25351, 49152 + 771, 99000}) lengths.push_back(n);
  const std::string wrong = pod_init::crc32c_first_mismatch(data, {0, 3}, lengths);
  if (!wrong.empty()) {
    std::printf("%s\n", wrong.c_str());
    return 1;
  }
  std::printf("methods checked:");
  for (pod_init::Crc32cMethod method : pod_init::crc32c_methods())
    std::printf(" %d", static_cast<int>(method));
  std::printf("\n");
  return 0;
}
