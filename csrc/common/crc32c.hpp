// CRC-32C (Castagnoli), the checksum of iSCSI, ext4 metadata and many
// storage formats: the SSE4.2 instruction in three interleaved lanes where the
// CPU has it, else a table.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pod_init {

// Continues `crc` (0 to start) over [data, data + length).
uint32_t crc32c(uint32_t crc, const void* data, size_t length);

// The CRC of A followed by B, from the CRCs of A and B and B's length, without
// reading either again: what a writer that checksums its parts one by one
// (and a header written last) needs for the whole.
uint32_t crc32c_combine(uint32_t first, uint32_t second, uint64_t second_length);

}  // namespace pod_init
