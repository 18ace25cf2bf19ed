// SHA-256 (FIPS 180-4), so `pod-init read` can prove what it read in a boot
// image that has no other tools.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pod_init {

class Sha256 {
 public:
  Sha256();
  void update(const uint8_t* data, size_t length);
  std::string hex_digest();  // finishes the hash; call once

 private:
  void block(const uint8_t* chunk);
  uint32_t state_[8];
  uint8_t buffer_[64];
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

}  // namespace pod_init
