#include "topology/config_space.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "common/sysfs.hpp"

namespace pod_init {

namespace {

constexpr unsigned kStatus = 0x06;
constexpr uint16_t kStatusCapList = 0x10;
constexpr unsigned kCapPointer = 0x34;
constexpr unsigned kCapIdPcie = 0x10;
constexpr unsigned kExtCapStart = 0x100;
constexpr unsigned kExtCapIdAcs = 0x000D;
constexpr unsigned kConfigSize = 4096;
// A malformed capability list can loop; real devices have far fewer entries.
constexpr int kMaxCapabilities = 64;

int read16(const ConfigAccess& access, unsigned offset, uint16_t* value) {
  uint32_t dword = 0;
  int rc = access.read32(offset & ~3u, &dword);
  if (rc < 0) return rc;
  *value = static_cast<uint16_t>(dword >> ((offset & 2u) * 8));
  return 0;
}

std::optional<unsigned> find_pcie_capability(const ConfigAccess& access) {
  uint16_t status = 0;
  if (read16(access, kStatus, &status) < 0 || !(status & kStatusCapList)) return std::nullopt;
  uint32_t dword = 0;
  if (access.read32(kCapPointer, &dword) < 0) return std::nullopt;
  unsigned offset = dword & 0xfcu;
  for (int i = 0; i < kMaxCapabilities && offset >= 0x40; ++i) {
    if (access.read32(offset, &dword) < 0) return std::nullopt;
    if ((dword & 0xffu) == kCapIdPcie) return offset;
    offset = (dword >> 8) & 0xfcu;
  }
  return std::nullopt;
}

}  // namespace

const char* port_type_name(PortType type) {
  switch (type) {
    case PortType::Endpoint:
      return "endpoint";
    case PortType::LegacyEndpoint:
      return "legacy_endpoint";
    case PortType::RootPort:
      return "root_port";
    case PortType::SwitchUpstream:
      return "switch_upstream";
    case PortType::SwitchDownstream:
      return "switch_downstream";
    case PortType::PcieToPciBridge:
      return "pcie_to_pci_bridge";
    case PortType::PciToPcieBridge:
      return "pci_to_pcie_bridge";
    case PortType::RootComplexEndpoint:
      return "root_complex_endpoint";
    case PortType::RootComplexEventCollector:
      return "root_complex_event_collector";
  }
  return "unknown";
}

std::optional<double> link_speed_from_code(int code) {
  static constexpr double kSpeeds[] = {2.5, 5.0, 8.0, 16.0, 32.0, 64.0};
  if (code < 1 || code > 6) return std::nullopt;
  return kSpeeds[code - 1];
}

int link_generation(double speed_gts) {
  for (int code = 1; code <= 6; ++code) {
    if (speed_gts == *link_speed_from_code(code)) return code;
  }
  return 0;
}

std::string format_link_speed(double speed_gts) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g GT/s", speed_gts);
  return buf;
}

int BufferConfigAccess::read32(unsigned offset, uint32_t* value) const {
  if (offset % 4 != 0) return -EINVAL;
  if (offset + 4 > size_) return -ENODATA;
  uint32_t v = 0;
  std::memcpy(&v, data_ + offset, 4);  // config space is little-endian, as is x86/arm64
  *value = v;
  return 0;
}

int FileConfigAccess::read32(unsigned offset, uint32_t* value) const {
  if (offset % 4 != 0) return -EINVAL;
  uint32_t v = 0;
  ssize_t n;
  do {
    n = ::pread(fd_, &v, 4, static_cast<off_t>(offset));
  } while (n < 0 && errno == EINTR);
  if (n < 0) return -errno;
  if (n != 4) return -ENODATA;
  *value = v;
  return 0;
}

ConfigInfo parse_config(const ConfigAccess& access) {
  ConfigInfo info;
  uint32_t dword = 0;
  info.header_readable = access.read32(0x3c, &dword) == 0;
  if (!info.header_readable) return info;

  if (auto cap = find_pcie_capability(access)) {
    uint16_t flags = 0;
    if (read16(access, *cap + 2, &flags) == 0) {
      info.port_type = static_cast<PortType>((flags >> 4) & 0xf);
    }
    uint32_t link_cap = 0;
    uint16_t link_status = 0;
    if (access.read32(*cap + 0x0c, &link_cap) == 0 &&
        read16(access, *cap + 0x12, &link_status) == 0) {
      LinkRegisters link;
      link.max_speed_code = static_cast<int>(link_cap & 0xf);
      link.max_width = static_cast<int>((link_cap >> 4) & 0x3f);
      link.speed_code = link_status & 0xf;
      link.width = (link_status >> 4) & 0x3f;
      info.link = link;
    }
  }

  // Extended capabilities exist only for PCI Express functions.
  if (!info.port_type || access.read32(kExtCapStart, &dword) < 0) return info;
  info.extended_readable = true;
  unsigned offset = kExtCapStart;
  for (int i = 0; i < kMaxCapabilities && dword != 0 && dword != 0xffffffffu; ++i) {
    if ((dword & 0xffffu) == kExtCapIdAcs) {
      uint32_t acs = 0;
      if (access.read32(offset + 4, &acs) == 0) {
        info.acs =
            AcsRegisters{static_cast<uint16_t>(acs & 0xffffu), static_cast<uint16_t>(acs >> 16)};
      }
      break;
    }
    unsigned next = (dword >> 20) & 0xffcu;
    if (next < kExtCapStart || next + 4 > kConfigSize || access.read32(next, &dword) < 0) break;
    offset = next;
  }
  return info;
}

int read_config(const std::string& path, ConfigInfo* out) {
  int fd = sysfs::open_attribute(path);
  if (fd < 0) return fd;
  *out = parse_config(FileConfigAccess(fd));
  ::close(fd);
  return 0;
}

}  // namespace pod_init
