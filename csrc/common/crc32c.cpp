#include "common/crc32c.hpp"

#include <array>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
// The crc32 instruction is SSE4.2's: functions that use it are built for it
// and called only where the CPU has it.
#define POD_INIT_CRC_INSTRUCTION __attribute__((target("sse4.2")))
#elif defined(__aarch64__)
#include <arm_acle.h>
#include <asm/hwcap.h>
#include <sys/auxv.h>
// ARMv8's CRC extension (every server core since, Grace's Neoverse V2 too).
#define POD_INIT_CRC_INSTRUCTION __attribute__((target("+crc")))
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

// x^exponent modulo the polynomial, by squaring.
uint32_t x_to_the(uint64_t exponent) {
  uint32_t result = kOne;
  uint32_t power = kOne >> 1;  // x
  for (; exponent != 0; exponent >>= 1) {
    if (exponent & 1) result = multiply_mod(result, power);
    power = multiply_mod(power, power);
  }
  return result;
}

uint32_t shift_by_bytes(uint64_t bytes) { return x_to_the(8 * bytes); }

uint32_t crc32c_table(uint32_t crc, const uint8_t* p, size_t length) {
  static const std::array<uint32_t, 256> table = make_table();
  for (size_t i = 0; i < length; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc;
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
  uint32_t operator()(uint32_t value) const {
    return table_[0][value & 0xFF] ^ table_[1][(value >> 8) & 0xFF] ^
           table_[2][(value >> 16) & 0xFF] ^ table_[3][(value >> 24) & 0xFF];
  }

 private:
  uint32_t table_[4][256];
};

#if defined(POD_INIT_CRC_INSTRUCTION)
// The instruction over 8 bytes, and over 1.
POD_INIT_CRC_INSTRUCTION inline uint32_t crc_word(uint32_t value, const uint8_t* p) {
  uint64_t word;
  std::memcpy(&word, p, 8);
#if defined(__x86_64__)
  return static_cast<uint32_t>(_mm_crc32_u64(value, word));
#else
  return __crc32cd(value, word);
#endif
}

POD_INIT_CRC_INSTRUCTION inline uint32_t crc_byte(uint32_t value, uint8_t byte) {
#if defined(__x86_64__)
  return _mm_crc32_u8(value, byte);
#else
  return __crc32cb(value, byte);
#endif
}

POD_INIT_CRC_INSTRUCTION uint32_t lane(uint32_t value, const uint8_t* p, size_t bytes) {
  for (size_t i = 0; i < bytes; i += 8) value = crc_word(value, p + i);
  return value;
}

// Three lanes of `lane_bytes` at once, then joined: the crc32 instruction
// finishes in three cycles but starts one every cycle, so a single stream
// (about 8 GB/s) leaves two thirds of it idle. Joining the lanes' values a,
// b, c costs two table shifts: CRC(A B C) = shift(shift(a) ^ b) ^ c.
POD_INIT_CRC_INSTRUCTION uint32_t three_lanes(uint32_t value, const uint8_t** p, size_t* length,
                                              size_t lane_bytes, const ZerosShift& shift) {
  while (*length >= 3 * lane_bytes) {
    uint32_t a = value, b = 0, c = 0;
    const uint8_t* q = *p;
    for (size_t i = 0; i < lane_bytes; i += 8) {
      a = crc_word(a, q + i);
      b = crc_word(b, q + lane_bytes + i);
      c = crc_word(c, q + 2 * lane_bytes + i);
    }
    value = shift(shift(a) ^ b) ^ c;
    *p += 3 * lane_bytes;
    *length -= 3 * lane_bytes;
  }
  return value;
}

constexpr size_t kLongLane = 8192;  // the join's cost is 0.1% of a lane
constexpr size_t kShortLane = 256;  // what is left of a long buffer, and records

POD_INIT_CRC_INSTRUCTION uint32_t crc32c_lanes(uint32_t crc, const uint8_t* p, size_t length) {
  static const ZerosShift long_shift(kLongLane), short_shift(kShortLane);
  crc = three_lanes(crc, &p, &length, kLongLane, long_shift);
  crc = three_lanes(crc, &p, &length, kShortLane, short_shift);
  crc = lane(crc, p, length & ~size_t{7});
  p += length & ~size_t{7};
  length &= 7;
  while (length-- > 0) crc = crc_byte(crc, *p++);
  return crc;
}
#endif

#if defined(__x86_64__)

// Carry-less multiplication folds the data instead: 16 bytes A followed by
// 8D bytes count modulo the polynomial as A_first * x^(64 + 8D) + A_second *
// x^(8D), and each product of a 64-bit half with a 32-bit constant
// (x^(64 + 8D) or x^(8D) modulo the polynomial) lands back in 16 bytes, to be
// added to the data 8D bytes on. With AVX-512 one instruction makes four such
// products, and four registers folded 256 bytes apart keep the multiplier
// busy: on an H200 node's Xeon, 56-69 GB/s in cache against the lanes' 22.
// SSE's one product an instruction is no faster than the lanes there (and
// slower from memory), so it is not used on its own.
//
// In the reflected order a product comes out 33 bits short of where the
// 128-bit slot wants it (a 64-bit half times a 32-bit constant spans 95
// bits), so the constants are x^(64 + 8D - 33) and x^(8D - 33).
struct FoldConstant {
  uint64_t first, second;
  explicit FoldConstant(uint64_t distance)
      : first(x_to_the(8 * distance + 31)), second(x_to_the(8 * distance - 33)) {}
};

__attribute__((target("pclmul"))) __m128i constant_16(const FoldConstant& constant) {
  return _mm_set_epi64x(static_cast<int64_t>(constant.second),
                        static_cast<int64_t>(constant.first));
}

__attribute__((target("pclmul"))) __m128i fold_16(__m128i x, __m128i constant, __m128i next) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, constant, 0x00),
                                     _mm_clmulepi64_si128(x, constant, 0x11)),
                       next);
}

// The CRC of 16 bytes from a zero start is their polynomial times x^32
// modulo the polynomial: the reduction the instruction does anyway.
__attribute__((target("sse4.2"))) uint32_t reduce_16(__m128i x) {
  uint64_t value = _mm_crc32_u64(0, static_cast<uint64_t>(_mm_cvtsi128_si64(x)));
  return static_cast<uint32_t>(
      _mm_crc32_u64(value, static_cast<uint64_t>(_mm_extract_epi64(x, 1))));
}

__attribute__((target("avx512f"))) __m512i constant_64(const FoldConstant& constant) {
  const auto first = static_cast<int64_t>(constant.first);
  const auto second = static_cast<int64_t>(constant.second);
  return _mm512_set_epi64(second, first, second, first, second, first, second, first);
}

__attribute__((target("avx512f,vpclmulqdq"))) __m512i fold_64(__m512i x, __m512i constant,
                                                              __m512i next) {
  // 0x96: the three-way exclusive or.
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, constant, 0x00),
                                   _mm512_clmulepi64_epi128(x, constant, 0x11), next, 0x96);
}

// Folds every whole round of [*p, *p + *length) into the running value and
// advances past them; the lanes carry on over what is left.
__attribute__((target("sse4.2,pclmul,avx512f,vpclmulqdq"))) uint32_t folds_512(uint32_t value,
                                                                               const uint8_t** p,
                                                                               size_t* length) {
  static const FoldConstant round_apart(256), register_apart(64), block_apart(16);
  if (*length < 256) return value;
  const uint8_t* q = *p;
  const size_t end = *length - *length % 256;
  __m512i a = _mm512_xor_si512(_mm512_loadu_si512(q),
                               _mm512_maskz_set1_epi32(1, static_cast<int32_t>(value)));
  __m512i b = _mm512_loadu_si512(q + 64), c = _mm512_loadu_si512(q + 128),
          d = _mm512_loadu_si512(q + 192);
  const __m512i by_round = constant_64(round_apart);
  for (size_t i = 256; i < end; i += 256) {
    a = fold_64(a, by_round, _mm512_loadu_si512(q + i));
    b = fold_64(b, by_round, _mm512_loadu_si512(q + i + 64));
    c = fold_64(c, by_round, _mm512_loadu_si512(q + i + 128));
    d = fold_64(d, by_round, _mm512_loadu_si512(q + i + 192));
  }
  const __m512i by_register = constant_64(register_apart);
  a = fold_64(fold_64(fold_64(a, by_register, b), by_register, c), by_register, d);
  const __m128i by_block = constant_16(block_apart);
  // Through memory: GCC 12 warns of the extract intrinsic's undefined operand.
  alignas(64) __m128i blocks[4];
  _mm512_store_si512(blocks, a);
  __m128i x = fold_16(fold_16(fold_16(blocks[0], by_block, blocks[1]), by_block, blocks[2]),
                      by_block, blocks[3]);
  *p += end;
  *length -= end;
  return reduce_16(x);
}

bool runs(Crc32cMethod method) {
  static const bool lanes = __builtin_cpu_supports("sse4.2");
  static const bool folds_512 = lanes && __builtin_cpu_supports("pclmul") &&
                                __builtin_cpu_supports("avx512f") &&
                                __builtin_cpu_supports("vpclmulqdq");
  switch (method) {
    case Crc32cMethod::kTable:
      return true;
    case Crc32cMethod::kLanes:
      return lanes;
    case Crc32cMethod::kFolds512:
      return folds_512;
  }
  return false;
}
#elif defined(__aarch64__)
bool runs(Crc32cMethod method) {
  static const bool lanes = (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0;
  return method == Crc32cMethod::kTable || (method == Crc32cMethod::kLanes && lanes);
}
#else
bool runs(Crc32cMethod method) { return method == Crc32cMethod::kTable; }
#endif

// By a method the CPU runs, on the inverted running value.
uint32_t compute(Crc32cMethod method, uint32_t crc, const uint8_t* p, size_t length) {
  switch (method) {
#if defined(__x86_64__)
    case Crc32cMethod::kFolds512:
      crc = folds_512(crc, &p, &length);
      return crc32c_lanes(crc, p, length);
#endif
#if defined(POD_INIT_CRC_INSTRUCTION)
    case Crc32cMethod::kLanes:
      return crc32c_lanes(crc, p, length);
#endif
    default:
      return crc32c_table(crc, p, length);
  }
}

}  // namespace

std::vector<Crc32cMethod> crc32c_methods() {
  std::vector<Crc32cMethod> methods;
  for (Crc32cMethod method : {Crc32cMethod::kTable, Crc32cMethod::kLanes, Crc32cMethod::kFolds512})
    if (runs(method)) methods.push_back(method);
  return methods;
}

uint32_t crc32c_by(Crc32cMethod method, uint32_t crc, const void* data, size_t length) {
  const auto chosen = runs(method) ? method : Crc32cMethod::kTable;
  return ~compute(chosen, ~crc, static_cast<const uint8_t*>(data), length);
}

uint32_t crc32c(uint32_t crc, const void* data, size_t length) {
  // The fastest the CPU runs: the last of crc32c_methods().
  static const Crc32cMethod best = crc32c_methods().back();
  return ~compute(best, ~crc, static_cast<const uint8_t*>(data), length);
}

// CRC(A || B) = CRC(A) * x^(8|B|) + CRC(B): the initial and final inversions
// of the two cancel, so this holds for the finished values.
uint32_t crc32c_combine(uint32_t first, uint32_t second, uint64_t second_length) {
  return multiply_mod(shift_by_bytes(second_length), first) ^ second;
}

}  // namespace pod_init
