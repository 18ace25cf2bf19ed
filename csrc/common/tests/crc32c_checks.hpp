// CRC-32C by its definition, one bit at a time: what every method's value
// is checked against.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pod_init {

inline uint32_t crc32c_bitwise(const uint8_t* p, size_t length) {
  uint32_t crc = ~0u;
  for (size_t i = 0; i < length; ++i) {
    crc ^= p[i];
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? 0x82F63B78u : 0);
  }
  return ~crc;
}

}  // namespace pod_init
