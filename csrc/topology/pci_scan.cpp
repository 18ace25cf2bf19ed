#include "topology/pci_scan.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <unordered_map>

#include "common/error.hpp"
#include "common/sysfs.hpp"
#include "common/text.hpp"

namespace pod_init {

namespace {

constexpr uint16_t kVendorNvidia = 0x10de;

DeviceKind kind_of(uint16_t vendor, uint32_t class_code) {
  uint32_t base_sub = class_code >> 8;
  if (vendor == kVendorNvidia && (base_sub == 0x0300 || base_sub == 0x0302)) return DeviceKind::Gpu;
  if (base_sub == 0x0200 || base_sub == 0x0207) return DeviceKind::Nic;
  if (class_code == 0x010802) return DeviceKind::Nvme;
  if (base_sub == 0x0600 || base_sub == 0x0604 || base_sub == 0x0609) return DeviceKind::Bridge;
  return DeviceKind::Other;
}

// Reads attributes of one device and records why one could not be used.
class AttributeReader {
 public:
  AttributeReader(std::string dir, std::string bdf, std::vector<Finding>* findings)
      : dir_(std::move(dir)), bdf_(std::move(bdf)), findings_(findings) {}

  // Absent attributes are normal for some devices (no link on a root-complex
  // function, no numa_node without CONFIG_NUMA): only other errors are findings.
  std::optional<std::string> optional(const char* name) { return read(name, false); }
  std::optional<std::string> required(const char* name) { return read(name, true); }

  std::optional<std::string> link_basename(const char* name) {
    std::string target;
    int rc = sysfs::read_link(dir_ + "/" + name, &target);
    if (rc == -ENOENT) return std::nullopt;
    if (rc < 0) {
      unreadable(name, rc);
      return std::nullopt;
    }
    return std::string(sysfs::basename(target));
  }

  // `parse` applied to an attribute that was read; content it rejects is a finding.
  template <typename Parse>
  auto parsed(const char* name, const std::optional<std::string>& text, Parse parse)
      -> decltype(parse(std::string_view())) {
    if (!text) return std::nullopt;
    auto value = parse(*text);
    if (!value) malformed(name, *text);
    return value;
  }

  void malformed(const char* name, const std::string& content) {
    std::string shown = printable(content.size() > 40 ? content.substr(0, 40) + "..." : content);
    findings_->push_back({Severity::Warning, finding_code::kSysfsMalformed, bdf_,
                          dir_ + "/" + name + ": unexpected content '" + shown + "'"});
  }

  void unreadable(const char* name, int rc) {
    findings_->push_back({Severity::Warning, finding_code::kSysfsUnreadable, bdf_,
                          dir_ + "/" + name + ": " + errno_text(-rc)});
  }

  const std::string& dir() const { return dir_; }

 private:
  std::optional<std::string> read(const char* name, bool required) {
    std::string text;
    int rc = sysfs::read_text(dir_ + "/" + name, &text);
    if (rc == 0) return text;
    if (required || rc != -ENOENT) unreadable(name, rc);
    return std::nullopt;
  }

  std::string dir_;
  std::string bdf_;
  std::vector<Finding>* findings_;
};

// Splits "<root>/devices/pci0000:00/0000:00:01.0/0000:01:00.0" into the host
// bridge component and the chain of functions.
void parse_device_path(const std::string& relative, std::string* root_bus,
                       std::vector<std::string>* functions) {
  std::string_view previous;
  for (std::string_view part : sysfs::split_path(relative)) {
    if (sysfs::is_bdf(part)) {
      if (functions->empty()) *root_bus = std::string(previous);
      functions->emplace_back(part);
    }
    previous = part;
  }
}

void read_link_state(AttributeReader& attrs, PciDevice* dev) {
  auto speed = [&attrs](const char* name) {
    auto text = attrs.optional(name);
    // "Unknown" is what the kernel writes for a link it cannot read (link down).
    if (text && *text == "Unknown") return std::optional<double>();
    return attrs.parsed(name, text, sysfs::parse_link_speed);
  };
  auto width = [&attrs](const char* name) {
    auto text = attrs.optional(name);
    // 255 is PCIE_LNK_WIDTH_UNKNOWN: no link to read (an integrated endpoint,
    // as QEMU's q35 devices on the root bus are).
    if (text && *text == "255") return std::optional<int>();
    return attrs.parsed(name, text, [](std::string_view lanes_text) {
      auto value = sysfs::parse_int(lanes_text);
      bool lanes = value && *value >= 0 && *value <= 64;
      return lanes ? std::optional<int>(static_cast<int>(*value)) : std::nullopt;
    });
  };
  dev->link.speed_gts = speed("current_link_speed");
  dev->link.max_speed_gts = speed("max_link_speed");
  dev->link.width = width("current_link_width");
  dev->link.max_width = width("max_link_width");
}

void read_device(AttributeReader& attrs, const std::string& relative, bool probe_bar0,
                 PciDevice* dev, std::vector<Finding>* findings) {
  std::vector<std::string> functions;
  parse_device_path(relative, &dev->root_bus, &functions);
  if (functions.empty() || functions.back() != dev->bdf) {
    attrs.malformed("", "device path does not end in " + dev->bdf);
  } else {
    functions.pop_back();
  }
  dev->upstream = std::move(functions);

  auto vendor = attrs.parsed("vendor", attrs.required("vendor"), sysfs::parse_hex);
  auto device = attrs.parsed("device", attrs.required("device"), sysfs::parse_hex);
  auto class_code = attrs.parsed("class", attrs.required("class"), sysfs::parse_hex);
  dev->vendor = static_cast<uint16_t>(vendor.value_or(0));
  dev->device = static_cast<uint16_t>(device.value_or(0));
  dev->class_code = static_cast<uint32_t>(class_code.value_or(0));
  dev->kind = kind_of(dev->vendor, dev->class_code);

  dev->driver = attrs.link_basename("driver").value_or("");
  auto numa = attrs.parsed("numa_node", attrs.optional("numa_node"), sysfs::parse_int);
  dev->numa_node = numa && *numa >= 0 && *numa < 65536 ? static_cast<int>(*numa) : -1;
  dev->local_cpulist = attrs.optional("local_cpulist").value_or("");
  auto group = attrs.parsed("iommu_group", attrs.link_basename("iommu_group"), sysfs::parse_int);
  dev->iommu_group = group ? static_cast<int>(*group) : -1;
  read_link_state(attrs, dev);

  if (auto resource = attrs.required("resource")) {
    dev->bars_known = parse_resource(*resource, &dev->bars) == 0;
    if (!dev->bars_known) {
      dev->bars.clear();
      attrs.malformed("resource", *resource);
    }
  }

  int rc = read_config(attrs.dir() + "/config", &dev->config);
  if (rc < 0 && rc != -ENOENT) attrs.unreadable("config", rc);
  dev->config_readable = dev->config.header_readable;
  // Older kernels and some hypervisors expose no link attributes; the
  // registers hold the same numbers.
  if (!dev->link.speed_gts && !dev->link.width && dev->config.link) {
    const LinkRegisters& regs = *dev->config.link;
    dev->link.speed_gts = link_speed_from_code(regs.speed_code);
    dev->link.max_speed_gts = link_speed_from_code(regs.max_speed_code);
    dev->link.width = regs.width;
    dev->link.max_width = regs.max_width;
    dev->link.from_config = true;
  }

  if (dev->kind == DeviceKind::Gpu && probe_bar0) {
    Bar0Probe probe = pod_init::probe_bar0(attrs.dir() + "/resource0");
    if (probe.state == Bar0State::Denied) {
      std::string why = probe.err == EPERM
                            ? "the driver owns the region and the kernel enforces strict devmem"
                            : "mapping a BAR needs root";
      findings->push_back({Severity::Info, finding_code::kBar0Denied, dev->bdf,
                           "BAR0 mapping refused (" + errno_name(probe.err) + "): " + why +
                               "; chip not identified from NV_PMC_BOOT_0"});
    } else if (probe.state == Bar0State::Failed) {
      findings->push_back({Severity::Warning, finding_code::kBar0Failed, dev->bdf,
                           attrs.dir() + "/resource0: " + errno_text(probe.err)});
    } else if (probe.state == Bar0State::Mapped && probe.boot0 == 0xffffffffu) {
      findings->push_back({Severity::Error, finding_code::kGpuNotResponding, dev->bdf,
                           "NV_PMC_BOOT_0 reads 0xffffffff: the GPU does not answer on the bus"});
    }
    dev->bar0 = probe;
  }
}

using DeviceMap = std::unordered_map<std::string, PciDevice*>;

// The PCI function whose directory a resolved sysfs path runs through.
PciDevice* owner_of(const std::string& path, const std::string& root, const DeviceMap& by_bdf) {
  if (path.compare(0, root.size(), root) != 0) return nullptr;
  auto owner = by_bdf.find(sysfs::last_bdf_component(path.substr(root.size())));
  return owner == by_bdf.end() ? nullptr : owner->second;
}

// Attaches the names under `<root>/<class_dir>` (net, infiniband, nvme) to the
// PCI function their device path runs through; virtio puts one level between.
void attach_class(const std::string& root, const char* class_dir, const DeviceMap& by_bdf,
                  std::vector<std::string> PciDevice::*names) {
  std::vector<std::string> entries;
  std::string dir = root + "/" + class_dir;
  if (sysfs::list_dir(dir, &entries) < 0) return;
  for (const std::string& entry : entries) {
    std::string path;
    if (sysfs::resolve_link(dir + "/" + entry, &path) < 0) continue;
    if (PciDevice* owner = owner_of(path, root, by_bdf)) (owner->*names).push_back(entry);
  }
}

// Block devices: a path through the PCI function, or for native NVMe
// multipath a virtual head whose `multipath/` links lead to the controllers.
void attach_block(const std::string& root, const DeviceMap& by_bdf) {
  std::vector<std::string> disks;
  std::string dir = root + "/block";
  if (sysfs::list_dir(dir, &disks) < 0) return;
  for (const std::string& disk : disks) {
    std::string head;
    if (sysfs::resolve_link(dir + "/" + disk, &head) < 0) continue;
    std::vector<std::string> paths = {head};
    std::vector<std::string> legs;
    if (sysfs::list_dir(head + "/multipath", &legs) == 0) {
      for (const std::string& leg : legs) {
        std::string path;
        if (sysfs::resolve_link(head + "/multipath/" + leg, &path) == 0) paths.push_back(path);
      }
    }
    for (const std::string& candidate : paths) {
      PciDevice* owner = owner_of(candidate, root, by_bdf);
      if (owner == nullptr) continue;
      auto& names = owner->block_devices;
      if (std::find(names.begin(), names.end(), disk) == names.end()) names.push_back(disk);
    }
  }
}

}  // namespace

const char* device_kind_name(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::Gpu:
      return "gpu";
    case DeviceKind::Nic:
      return "nic";
    case DeviceKind::Nvme:
      return "nvme";
    case DeviceKind::Bridge:
      return "bridge";
    case DeviceKind::Other:
      return "other";
  }
  return "other";
}

int scan_pci_devices(const PciScanOptions& options, std::vector<PciDevice>* devices,
                     std::vector<Finding>* findings) {
  std::vector<std::string> names;
  int rc = sysfs::list_dir(options.sysfs_root + "/bus/pci/devices", &names);
  if (rc < 0) return rc;
  // Everything below works on the canonical root, so that links can be
  // followed lexically (sysfs::resolve_link).
  std::string root;
  rc = sysfs::resolve(options.sysfs_root, &root);
  if (rc < 0) return rc;
  if (root == "/") root.clear();
  std::string bus_dir = root + "/bus/pci/devices";

  devices->clear();
  devices->reserve(names.size());
  for (const std::string& name : names) {
    std::string link = bus_dir + "/" + name;
    if (!sysfs::is_bdf(name)) {
      findings->push_back(
          {Severity::Warning, finding_code::kSysfsMalformed, "", link + ": not a PCI address"});
      continue;
    }
    std::string path;
    rc = sysfs::resolve_link(link, &path);
    if (rc < 0) {
      bool dangling = rc == -ENOENT;
      findings->push_back(
          {Severity::Warning,
           dangling ? finding_code::kSysfsDanglingLink : finding_code::kSysfsUnreadable, name,
           link + (dangling ? ": link points to nothing" : ": " + errno_text(-rc))});
      continue;
    }
    if (path.compare(0, root.size() + 1, root + "/") != 0) {
      findings->push_back({Severity::Warning, finding_code::kSysfsMalformed, name,
                           link + ": resolves outside the sysfs root, to " + path});
      continue;
    }
    PciDevice dev;
    dev.bdf = name;
    dev.path = path;
    AttributeReader attrs(path, name, findings);
    read_device(attrs, path.substr(root.size()), options.probe_bar0, &dev, findings);
    devices->push_back(std::move(dev));
  }

  DeviceMap by_bdf;
  for (PciDevice& dev : *devices) by_bdf[dev.bdf] = &dev;
  attach_class(root, "class/net", by_bdf, &PciDevice::net_interfaces);
  attach_class(root, "class/infiniband", by_bdf, &PciDevice::ib_devices);
  attach_class(root, "class/nvme", by_bdf, &PciDevice::nvme_controllers);
  attach_block(root, by_bdf);
  return 0;
}

int count_numa_nodes(const std::string& sysfs_root) {
  std::vector<std::string> entries;
  if (sysfs::list_dir(sysfs_root + "/devices/system/node", &entries) < 0) return 0;
  return static_cast<int>(std::count_if(entries.begin(), entries.end(), [](const std::string& e) {
    return e.size() > 4 && e.compare(0, 4, "node") == 0 && sysfs::parse_int(e.substr(4));
  }));
}

}  // namespace pod_init
