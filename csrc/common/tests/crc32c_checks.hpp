// CRC-32C by its definition, one bit at a time, and the check of every
// method the CPU runs against it: shared by the unit tests and the program a
// cross-built test runs under emulation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/crc32c.hpp"

namespace pod_init {

inline uint32_t crc32c_bitwise(const uint8_t* p, size_t length) {
  uint32_t crc = ~0u;
  for (size_t i = 0; i < length; ++i) {
    crc ^= p[i];
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? 0x82F63B78u : 0);
  }
  return ~crc;
}

// The first value a method gets wrong over data[start, start + length) for
// every start and length, whole and as a running CRC carried into a second
// call; "" when every one is right.
inline std::string crc32c_first_mismatch(const std::vector<uint8_t>& data,
                                         const std::vector<size_t>& starts,
                                         const std::vector<size_t>& lengths) {
  const std::vector<Crc32cMethod> methods = crc32c_methods();
  for (size_t start : starts)
    for (size_t n : lengths) {
      const uint8_t* p = data.data() + start;
      const uint32_t expected = crc32c_bitwise(p, n);
      const size_t half = n / 2;
      for (Crc32cMethod method : methods) {
        const uint32_t whole = crc32c_by(method, 0, p, n);
        const uint32_t parts = crc32c_by(method, crc32c_by(method, 0, p, half), p + half, n - half);
        if (whole != expected || parts != expected)
          return "method " + std::to_string(static_cast<int>(method)) + ", length " +
                 std::to_string(n) + " from " + std::to_string(start) + ": " +
                 std::to_string(whole) + ", in two calls " + std::to_string(parts) + ", not " +
                 std::to_string(expected);
      }
    }
  return "";
}

}  // namespace pod_init
