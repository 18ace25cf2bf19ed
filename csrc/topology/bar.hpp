// PCI BARs from sysfs `resource`, and the read-only BAR0 probe of NVIDIA GPUs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace pod_init {

struct Bar {
  int index = 0;  // resource line, 0..5
  uint64_t start = 0;
  uint64_t size = 0;
  bool is_io = false;
  bool is_64bit = false;
  bool prefetchable = false;
};

// Parses the first six lines of a sysfs `resource` file. Unused slots (all
// zero, including the upper half of a 64-bit BAR) are left out. Returns
// -EINVAL for a line that is not three hex numbers with end >= start.
int parse_resource(const std::string& text, std::vector<Bar>* bars);

// NVIDIA's "BAR1" (the framebuffer aperture) is the second memory BAR: at
// resource1 when BAR0 is 32-bit (bare-metal H100), at resource2 when BAR0 is
// 64-bit (the H200 VMs measured). Returns nullptr when the device has no such BAR.
const Bar* nvidia_bar1(const std::vector<Bar>& bars);

// "256 GiB", "32 MiB", "16 KiB".
std::string format_bar_size(uint64_t bytes);

enum class Bar0State {
  Mapped,       // BAR0 mapped read-only and NV_PMC_BOOT_0 read
  Denied,       // the kernel refused (EPERM/EACCES: a driver owns it under strict devmem)
  Unavailable,  // no resource0 file
  Failed,       // any other error, in `err`
};
const char* bar0_state_name(Bar0State state);

struct Bar0Probe {
  Bar0State state = Bar0State::Unavailable;
  int err = 0;  // positive errno for Denied/Failed
  uint32_t boot0 = 0;
  std::string chip;          // "GH100"; "" when unknown
  std::string architecture;  // "Hopper"; "" when unknown
};

struct ChipId {
  std::string chip;
  std::string architecture;
};
// Decodes NV_PMC_BOOT_0: the chip id is bits 28:20 (0x180 GH100), the
// architecture bits 28:24. Unknown ids give "" names.
ChipId decode_boot0(uint32_t boot0);

// Maps the first page of `resource_path` with PROT_READ and reads the 32-bit
// register at offset 0. Never writes, never maps writable.
Bar0Probe probe_bar0(const std::string& resource_path);

}  // namespace pod_init
