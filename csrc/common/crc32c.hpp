// CRC-32C (Castagnoli), the checksum of iSCSI, ext4 metadata and many
// storage formats: the SSE4.2 instruction where the CPU has it, else a table.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pod_init {

// Continues `crc` (0 to start) over [data, data + length).
uint32_t crc32c(uint32_t crc, const void* data, size_t length);

}  // namespace pod_init
