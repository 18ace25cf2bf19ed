#include "pod_init/report.hpp"

#include <algorithm>
#include <cstdio>

#include "pod_init/error.hpp"
#include "pod_init/json_writer.hpp"

namespace pod_init {

namespace {

std::string hex(uint64_t value, int digits) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%0*llx", digits, static_cast<unsigned long long>(value));
  return buf;
}

template <typename T>
void optional_value(JsonWriter& json, const char* key, const std::optional<T>& value) {
  json.key(key);
  if (value) {
    json.value(*value);
  } else {
    json.null();
  }
}

void strings(JsonWriter& json, const char* key, const std::vector<std::string>& values) {
  json.key(key).begin_array();
  for (const std::string& v : values) json.value(v);
  json.end_array();
}

void write_link(JsonWriter& json, const LinkInfo& link) {
  json.key("link");
  if (!link.speed_gts && !link.width && !link.max_speed_gts && !link.max_width) {
    json.null();
    return;
  }
  json.begin_object();
  optional_value(json, "speed_gts", link.speed_gts);
  optional_value(json, "max_speed_gts", link.max_speed_gts);
  optional_value(json, "width", link.width);
  optional_value(json, "max_width", link.max_width);
  json.key("generation").value(link.speed_gts ? link_generation(*link.speed_gts) : 0);
  json.key("max_generation").value(link.max_speed_gts ? link_generation(*link.max_speed_gts) : 0);
  json.key("source").value(link.from_config ? "config" : "sysfs");
  json.end_object();
}

void write_gpu(JsonWriter& json, const PciDevice& dev) {
  json.key("bar0");
  if (!dev.bar0) {
    json.null();
  } else {
    const Bar0Probe& probe = *dev.bar0;
    bool mapped = probe.state == Bar0State::Mapped;
    json.begin_object().key("state").value(bar0_state_name(probe.state));
    json.key("errno");
    if (probe.err) {
      json.value(errno_name(probe.err));
    } else {
      json.null();
    }
    json.key("boot0");
    if (mapped) {
      json.value(hex(probe.boot0, 8));
    } else {
      json.null();
    }
    json.key("chip").value(probe.chip).key("architecture").value(probe.architecture);
    json.end_object();
  }
  const Bar* bar1 = nvidia_bar1(dev.bars);
  json.key("bar1_size");
  if (bar1) {
    json.value(bar1->size);
  } else {
    json.null();
  }
}

void write_device(JsonWriter& json, const PciDevice& dev) {
  json.begin_object();
  json.key("bdf").value(dev.bdf);
  json.key("kind").value(device_kind_name(dev.kind));
  json.key("vendor").value(hex(dev.vendor, 4));
  json.key("device").value(hex(dev.device, 4));
  json.key("class").value(hex(dev.class_code, 6));
  json.key("driver").value(dev.driver);
  json.key("numa_node").value(dev.numa_node);
  json.key("local_cpulist").value(dev.local_cpulist);
  json.key("iommu_group");
  if (dev.iommu_group >= 0) {
    json.value(dev.iommu_group);
  } else {
    json.null();
  }
  json.key("path").value(dev.path);
  json.key("root_bus").value(dev.root_bus);
  strings(json, "upstream", dev.upstream);
  json.key("port_type");
  if (dev.config.port_type) {
    json.value(port_type_name(*dev.config.port_type));
  } else {
    json.null();
  }
  json.key("config_readable").value(dev.config_readable);
  write_link(json, dev.link);
  json.key("bars").begin_array();
  for (const Bar& bar : dev.bars) {
    json.begin_object()
        .key("index")
        .value(bar.index)
        .key("start")
        .value(bar.start)
        .key("size")
        .value(bar.size)
        .key("is_64bit")
        .value(bar.is_64bit)
        .key("prefetchable")
        .value(bar.prefetchable)
        .key("io")
        .value(bar.is_io)
        .end_object();
  }
  json.end_array();
  json.key("acs");
  if (dev.config.acs) {
    json.begin_object()
        .key("capability")
        .value(static_cast<int>(dev.config.acs->capability))
        .key("control")
        .value(static_cast<int>(dev.config.acs->control))
        .key("redirect")
        .value(dev.config.acs->redirects_peer_traffic())
        .end_object();
  } else {
    json.null();
  }
  strings(json, "net", dev.net_interfaces);
  strings(json, "infiniband", dev.ib_devices);
  strings(json, "nvme_controllers", dev.nvme_controllers);
  strings(json, "block_devices", dev.block_devices);
  if (dev.kind == DeviceKind::Gpu) write_gpu(json, dev);
  json.end_object();
}

std::string pad(const std::string& text, size_t width) {
  return text.size() >= width ? text + " " : text + std::string(width - text.size(), ' ');
}

std::string link_text(const LinkInfo& link) {
  auto one = [](const std::optional<int>& width, const std::optional<double>& speed) {
    return "x" + (width ? std::to_string(*width) : std::string("?")) + " @ " +
           (speed ? format_link_speed(*speed) : std::string("? GT/s"));
  };
  if (!link.width && !link.speed_gts) return "no link info";
  return one(link.width, link.speed_gts) + " (max " + one(link.max_width, link.max_speed_gts) + ")";
}

std::string describe(const PciDevice& dev) {
  std::string text;
  if (dev.kind == DeviceKind::Gpu && dev.bar0) {
    const Bar0Probe& probe = *dev.bar0;
    if (probe.state == Bar0State::Mapped) {
      text += probe.chip.empty() ? "chip " + hex((probe.boot0 >> 20) & 0x1ff, 3) : probe.chip;
      if (!probe.architecture.empty()) text += " " + probe.architecture;
    } else {
      text += "BAR0 " + std::string(bar0_state_name(probe.state));
      if (probe.err) text += " (" + errno_name(probe.err) + ")";
    }
  }
  auto append_names = [&text](const std::vector<std::string>& names) {
    for (const std::string& name : names) text += (text.empty() ? "" : " ") + name;
  };
  append_names(dev.ib_devices);
  append_names(dev.net_interfaces);
  append_names(dev.nvme_controllers);
  append_names(dev.block_devices);
  return text;
}

}  // namespace

std::string topology_json(const Topology& topo) {
  JsonWriter json;
  json.begin_object();
  json.key("sysfs_root").value(topo.sysfs_root);
  json.key("scan_seconds").value(topo.scan_seconds);
  json.key("numa_nodes").value(topo.numa_nodes);
  json.key("devices").begin_array();
  for (const PciDevice& dev : topo.devices) write_device(json, dev);
  json.end_array();

  json.key("matrix").begin_object();
  json.key("devices").begin_array();
  for (size_t member : topo.matrix.members) json.value(topo.devices[member].bdf);
  json.end_array();
  strings(json, "labels", topo.matrix.labels);
  json.key("rows").begin_array();
  for (const auto& row : topo.matrix.rows) {
    json.begin_array();
    for (Level level : row) json.value(level_name(level));
    json.end_array();
  }
  json.end_array();
  json.key("nvlinks");
  if (topo.matrix.nvlinks.empty()) {
    json.null();
  } else {
    json.begin_array();
    for (const auto& row : topo.matrix.nvlinks) {
      json.begin_array();
      for (int count : row) json.value(count);
      json.end_array();
    }
    json.end_array();
  }
  json.end_object();

  json.key("findings").begin_array();
  for (const Finding& f : topo.findings) {
    json.begin_object()
        .key("severity")
        .value(severity_name(f.severity))
        .key("code")
        .value(f.code)
        .key("device")
        .value(f.device)
        .key("message")
        .value(f.message)
        .end_object();
  }
  json.end_array();
  json.end_object();
  return json.str() + "\n";
}

std::string topology_text(const Topology& topo) {
  const Matrix& matrix = topo.matrix;
  std::string out;
  size_t width = 6;
  for (const std::string& label : matrix.labels) width = std::max(width, label.size() + 2);

  out += pad("", width);
  for (const std::string& label : matrix.labels) out += pad(label, width);
  out += "CPU Affinity  NUMA Affinity\n";
  for (size_t r = 0; r < matrix.rows.size(); ++r) {
    const PciDevice& dev = topo.devices[matrix.members[r]];
    out += pad(matrix.labels[r], width);
    for (size_t c = 0; c < matrix.rows[r].size(); ++c) out += pad(matrix_cell(matrix, r, c), width);
    out += pad(dev.local_cpulist.empty() ? "N/A" : dev.local_cpulist, 14);
    out += (dev.numa_node >= 0 ? std::to_string(dev.numa_node) : std::string("N/A")) + "\n";
  }
  if (matrix.rows.empty()) out += "(no GPU, NIC or NVMe device found)\n";

  out += "\nDevices:\n";
  for (size_t r = 0; r < matrix.members.size(); ++r) {
    const PciDevice& dev = topo.devices[matrix.members[r]];
    char ids[16];
    std::snprintf(ids, sizeof ids, "%04x:%04x", dev.vendor, dev.device);
    std::string line =
        "  " + pad(matrix.labels[r], width) + dev.bdf + "  " + ids + "  " + link_text(dev.link);
    if (dev.kind == DeviceKind::Gpu) {
      const Bar* bar1 = nvidia_bar1(dev.bars);
      line += bar1 ? "  BAR1 " + format_bar_size(bar1->size) : "  BAR1 none";
    }
    std::string names = describe(dev);
    if (!names.empty()) line += "  " + names;
    out += line + "\n";
  }

  out +=
      "\nLegend:\n"
      "  X    = Self\n"
      "  SYS  = Connection traversing PCIe and the interconnect between NUMA nodes\n"
      "  NODE = Connection traversing PCIe and the interconnect between host bridges of a NUMA "
      "node\n"
      "  PHB  = Connection traversing PCIe and a PCIe host bridge (typically the CPU)\n"
      "  PXB  = Connection traversing several PCIe switches, no host bridge\n"
      "  PIX  = Connection traversing at most one PCIe switch\n";
  out += matrix.nvlinks.empty()
             ? "  NV#  = not known: NVLinks come from NVML (pyinit with a driver)\n"
             : "  NV#  = Connection traversing a bonded set of # NVLinks\n";

  out += "\nFindings:";
  if (topo.findings.empty()) out += " none";
  out += "\n";
  for (const Finding& f : topo.findings) {
    out += "  " + pad(severity_name(f.severity), 8) + pad(f.code, 21) +
           pad(f.device.empty() ? "-" : f.device, 13) + f.message + "\n";
  }
  char timing[96];
  std::snprintf(timing, sizeof timing, "\nScanned %zu PCI functions under %s in %.2f ms\n",
                topo.devices.size(), topo.sysfs_root.c_str(), topo.scan_seconds * 1e3);
  out += timing;
  return out;
}

}  // namespace pod_init
