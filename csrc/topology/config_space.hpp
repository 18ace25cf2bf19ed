// PCI configuration space: the PCI Express capability (port type, link
// capability and status) and the ACS extended capability. Read only, a dword
// at a time, so a scan touches a handful of registers instead of 4 KiB per device.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace pod_init {

enum class PortType {
  Endpoint = 0,
  LegacyEndpoint = 1,
  RootPort = 4,
  SwitchUpstream = 5,
  SwitchDownstream = 6,
  PcieToPciBridge = 7,
  PciToPcieBridge = 8,
  RootComplexEndpoint = 9,
  RootComplexEventCollector = 10,
};
const char* port_type_name(PortType type);

struct LinkRegisters {
  int max_speed_code = 0;  // Link Capabilities 3:0 (1 = 2.5 GT/s ... 6 = 64 GT/s)
  int max_width = 0;       // Link Capabilities 9:4
  int speed_code = 0;      // Link Status 3:0
  int width = 0;           // Link Status 9:4
};
// 2.5, 5, 8, 16, 32, 64 GT/s for codes 1..6; nullopt otherwise.
std::optional<double> link_speed_from_code(int code);
// PCIe generation (1..6) for a speed in GT/s; 0 when it is not a PCIe rate.
int link_generation(double speed_gts);
// "32 GT/s", "2.5 GT/s".
std::string format_link_speed(double speed_gts);

struct AcsRegisters {
  uint16_t capability = 0;
  uint16_t control = 0;
  static constexpr uint16_t kSourceValidation = 0x01;
  static constexpr uint16_t kTranslationBlocking = 0x02;
  static constexpr uint16_t kRequestRedirect = 0x04;
  static constexpr uint16_t kCompletionRedirect = 0x08;
  static constexpr uint16_t kUpstreamForwarding = 0x10;
  static constexpr uint16_t kEgressControl = 0x20;
  static constexpr uint16_t kDirectTranslated = 0x40;
  // Request/completion redirect and egress control send peer-to-peer traffic
  // up to the root complex (or block it), which is what hurts GPU P2P and GPUDirect.
  bool redirects_peer_traffic() const {
    return (control & (kRequestRedirect | kCompletionRedirect | kEgressControl)) != 0;
  }
};

// Source of config-space dwords: a sysfs `config` file, or bytes in a test.
class ConfigAccess {
 public:
  virtual ~ConfigAccess() = default;
  // Reads the aligned dword at `offset`; 0 or -errno (-ENODATA past what is readable).
  virtual int read32(unsigned offset, uint32_t* value) const = 0;
};

class BufferConfigAccess : public ConfigAccess {
 public:
  BufferConfigAccess(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  int read32(unsigned offset, uint32_t* value) const override;

 private:
  const uint8_t* data_;
  size_t size_;
};

// pread() on an open sysfs `config` file. Unprivileged readers get only the
// first 64 bytes: reads beyond come back short and report -ENODATA.
class FileConfigAccess : public ConfigAccess {
 public:
  explicit FileConfigAccess(int fd) : fd_(fd) {}
  int read32(unsigned offset, uint32_t* value) const override;

 private:
  int fd_;
};

struct ConfigInfo {
  bool header_readable = false;  // the first 64 bytes
  std::optional<PortType> port_type;
  std::optional<LinkRegisters> link;
  // Extended space (0x100+) needs root; nullopt acs with extended_readable
  // true means the device has no ACS capability.
  bool extended_readable = false;
  std::optional<AcsRegisters> acs;
};

ConfigInfo parse_config(const ConfigAccess& access);
// Opens and parses `path`; 0 or -errno from open().
int read_config(const std::string& path, ConfigInfo* out);

}  // namespace pod_init
