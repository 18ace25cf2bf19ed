#include "common/crc32c.hpp"

#include <array>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace pod_init {

namespace {

constexpr uint32_t kPolynomial = 0x82F63B78;  // reflected 0x1EDC6F41

std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t value = i;
    for (int bit = 0; bit < 8; ++bit) value = (value >> 1) ^ ((value & 1) ? kPolynomial : 0);
    table[i] = value;
  }
  return table;
}

// Polynomials over GF(2) in the CRC's reflected order (kPolynomial's): bit
// 31 holds x^0.
constexpr uint32_t kOne = 1u << 31;

// a * b modulo the CRC-32C polynomial: b times x once per bit of a, added
// where a has the bit.
uint32_t multiply_mod(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t bit = kOne; bit != 0; bit >>= 1) {
    if (a & bit) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kPolynomial : b >> 1;
  }
  return product;
}

// x^(8 * bytes) modulo the polynomial, by squaring.
uint32_t shift_by_bytes(uint64_t bytes) {
  uint32_t result = kOne;
  uint32_t power = kOne >> 8;  // x^8: one byte
  for (; bytes != 0; bytes >>= 1) {
    if (bytes & 1) result = multiply_mod(result, power);
    power = multiply_mod(power, power);
  }
  return result;
}

uint32_t crc32c_table(uint32_t crc, const uint8_t* p, size_t length) {
  static const std::array<uint32_t, 256> table = make_table();
  for (size_t i = 0; i < length; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint64_t lane(uint64_t value, const uint8_t* p, size_t bytes) {
  for (size_t i = 0; i < bytes; i += 8) {
    uint64_t word;
    std::memcpy(&word, p + i, 8);
    value = _mm_crc32_u64(value, word);
  }
  return value;
}

// What `bytes` zero bytes after a CRC's running value do to it: a linear map
// over GF(2), so a table per byte of the value covers all 2^32 of them.
class ZerosShift {
 public:
  explicit ZerosShift(uint64_t bytes) {
    const uint32_t power = shift_by_bytes(bytes);
    for (int k = 0; k < 4; ++k)
      for (uint32_t v = 0; v < 256; ++v) table_[k][v] = multiply_mod(power, v << (8 * k));
  }
  uint32_t operator()(uint64_t value) const {
    return table_[0][value & 0xFF] ^ table_[1][(value >> 8) & 0xFF] ^
           table_[2][(value >> 16) & 0xFF] ^ table_[3][(value >> 24) & 0xFF];
  }

 private:
  uint32_t table_[4][256];
};

// Three lanes of `lane_bytes` at once, then joined: the crc32 instruction
// finishes in three cycles but starts one every cycle, so a single stream
// (about 8 GB/s) leaves two thirds of it idle. Joining the lanes' values a,
// b, c costs two table shifts: CRC(A B C) = shift(shift(a) ^ b) ^ c.
__attribute__((target("sse4.2"))) uint64_t three_lanes(uint64_t value, const uint8_t** p,
                                                       size_t* length, size_t lane_bytes,
                                                       const ZerosShift& shift) {
  while (*length >= 3 * lane_bytes) {
    uint64_t a = value, b = 0, c = 0;
    const uint8_t* q = *p;
    for (size_t i = 0; i < lane_bytes; i += 8) {
      uint64_t x, y, z;
      std::memcpy(&x, q + i, 8);
      std::memcpy(&y, q + lane_bytes + i, 8);
      std::memcpy(&z, q + 2 * lane_bytes + i, 8);
      a = _mm_crc32_u64(a, x);
      b = _mm_crc32_u64(b, y);
      c = _mm_crc32_u64(c, z);
    }
    value = shift(shift(a) ^ b) ^ c;
    *p += 3 * lane_bytes;
    *length -= 3 * lane_bytes;
  }
  return value;
}

constexpr size_t kLongLane = 8192;  // the join's cost is 0.1% of a lane
constexpr size_t kShortLane = 256;  // what is left of a long buffer, and records

__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(uint32_t crc, const uint8_t* p,
                                                        size_t length) {
  static const ZerosShift long_shift(kLongLane), short_shift(kShortLane);
  uint64_t value = crc;
  value = three_lanes(value, &p, &length, kLongLane, long_shift);
  value = three_lanes(value, &p, &length, kShortLane, short_shift);
  value = lane(value, p, length & ~size_t{7});
  p += length & ~size_t{7};
  length &= 7;
  auto small = static_cast<uint32_t>(value);
  while (length-- > 0) small = _mm_crc32_u8(small, *p++);
  return small;
}

bool has_sse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t crc32c(uint32_t crc, const void* data, size_t length) {
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
#if defined(__x86_64__)
  if (has_sse42()) return ~crc32c_sse42(crc, p, length);
#endif
  return ~crc32c_table(crc, p, length);
}

// CRC(A || B) = CRC(A) * x^(8|B|) + CRC(B): the initial and final inversions
// of the two cancel, so this holds for the finished values.
uint32_t crc32c_combine(uint32_t first, uint32_t second, uint64_t second_length) {
  return multiply_mod(shift_by_bytes(second_length), first) ^ second;
}

}  // namespace pod_init
