// CRC-32C (Castagnoli), the checksum of iSCSI, ext4 metadata and many
// storage formats: AVX-512's carry-less multiplication folding the data where
// the CPU has it, the CPU's crc32c instruction (SSE4.2's, ARMv8's CRC
// extension) in three interleaved lanes for the rest and on other CPUs, else
// a table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pod_init {

// Continues `crc` (0 to start) over [data, data + length), by the fastest
// method the CPU runs.
uint32_t crc32c(uint32_t crc, const void* data, size_t length);

// The ways to compute it; each gives the same value.
enum class Crc32cMethod { kTable, kLanes, kFolds512 };

// Those this CPU runs, slowest first: what tests check one by one.
std::vector<Crc32cMethod> crc32c_methods();

// crc32c by one method (the table where the CPU cannot run it).
uint32_t crc32c_by(Crc32cMethod method, uint32_t crc, const void* data, size_t length);

// The CRC of A followed by B, from the CRCs of A and B and B's length, without
// reading either again: what a writer that checksums its parts one by one
// (and a header written last) needs for the whole.
uint32_t crc32c_combine(uint32_t first, uint32_t second, uint64_t second_length);

}  // namespace pod_init
