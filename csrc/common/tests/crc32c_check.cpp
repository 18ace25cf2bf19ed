// Every CRC-32C method the CPU runs against the definition, with no test
// framework: what a cross-built test runs under an emulated CPU of another
// architecture. Prints the methods it checked; exits 1 on the first wrong
// value.
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "common/crc32c.hpp"
#include "common/tests/crc32c_definition.hpp"

int main() {
  using pod_init::crc32c_by;
  std::mt19937 random(5);
  std::vector<uint8_t> data(100000);
  for (uint8_t& byte : data) byte = static_cast<uint8_t>(random());
  const std::vector<pod_init::Crc32cMethod> methods = pod_init::crc32c_methods();
  // Every length to 800 (the short lanes' rounds and what they leave), then
  // past the long lanes' 3 x 8192.
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 800; ++n) lengths.push_back(n);
  for (size_t n : {24575, 24576, 24577, 25351, 49152 + 771, 99000}) lengths.push_back(n);
  for (size_t start : {0, 3})
    for (size_t n : lengths) {
      const uint32_t expected = pod_init::crc32c_bitwise(data.data() + start, n);
      for (pod_init::Crc32cMethod method : methods) {
        const size_t half = n / 3;
        const uint32_t whole = crc32c_by(method, 0, data.data() + start, n);
        const uint32_t parts = crc32c_by(method, crc32c_by(method, 0, data.data() + start, half),
                                         data.data() + start + half, n - half);
        if (whole != expected || parts != expected) {
          std::printf("method %d: length %zu from %zu: %08x, in parts %08x, not %08x\n",
                      static_cast<int>(method), n, start, whole, parts, expected);
          return 1;
        }
      }
    }
  std::printf("methods checked:");
  for (pod_init::Crc32cMethod method : methods) std::printf(" %d", static_cast<int>(method));
  std::printf("\n");
  return 0;
}
