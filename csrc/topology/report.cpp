#include "topology/report.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "common/error.hpp"
#include "common/json_reader.hpp"
#include "common/json_writer.hpp"
#include "common/text.hpp"

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
           pad(f.device.empty() ? "-" : printable(f.device), 13) + printable(f.message) + "\n";
  }
  char milliseconds[32];
  std::snprintf(milliseconds, sizeof milliseconds, "%.2f", topo.scan_seconds * 1e3);
  out += "\nScanned " + std::to_string(topo.devices.size()) + " PCI functions under " +
         printable(topo.sysfs_root) + " in " + milliseconds + " ms\n";
  return out;
}

namespace {

// The enum value whose name() is `text`, among `values`; InputError otherwise.
template <typename Enum, typename Name>
Enum named(const JsonValue& value, std::initializer_list<Enum> values, Name name,
           const std::string& source) {
  const std::string& text = value.string();
  for (Enum candidate : values) {
    if (text == name(candidate)) return candidate;
  }
  throw InputError(source, 0, "unknown value '" + text + "'");
}

uint64_t hex_value(const JsonValue& value, const std::string& source) {
  const std::string& text = value.string();
  char* stop = nullptr;
  uint64_t number = std::strtoull(text.c_str(), &stop, 16);
  if (text.rfind("0x", 0) != 0 || *stop != '\0') {
    throw InputError(source, 0, "expected a hex number, not '" + text + "'");
  }
  return number;
}

std::vector<std::string> string_list(const JsonValue& value) {
  std::vector<std::string> out;
  for (const JsonValue& item : value.array()) out.push_back(item.string());
  return out;
}

template <typename T>
std::optional<T> optional_number(const JsonValue& value) {
  if (value.is_null()) return std::nullopt;
  return static_cast<T>(value.number());
}

int errno_from_name(const std::string& name) {
  for (int err = 1; err < 4096; ++err) {
    if (errno_name(err) == name) return err;
  }
  return 0;
}

PciDevice device_from_json(const JsonValue& raw, const std::string& source) {
  PciDevice dev;
  dev.bdf = raw["bdf"].string();
  dev.kind = named(
      raw["kind"],
      {DeviceKind::Gpu, DeviceKind::Nic, DeviceKind::Nvme, DeviceKind::Bridge, DeviceKind::Other},
      device_kind_name, source);
  dev.vendor = static_cast<uint16_t>(hex_value(raw["vendor"], source));
  dev.device = static_cast<uint16_t>(hex_value(raw["device"], source));
  dev.class_code = static_cast<uint32_t>(hex_value(raw["class"], source));
  dev.driver = raw["driver"].string();
  dev.numa_node = static_cast<int>(raw["numa_node"].integer());
  dev.local_cpulist = raw["local_cpulist"].string();
  dev.iommu_group =
      raw["iommu_group"].is_null() ? -1 : static_cast<int>(raw["iommu_group"].integer());
  dev.path = raw["path"].string();
  dev.root_bus = raw["root_bus"].string();
  dev.upstream = string_list(raw["upstream"]);
  if (!raw["port_type"].is_null()) {
    dev.config.port_type = named(
        raw["port_type"],
        {PortType::Endpoint, PortType::LegacyEndpoint, PortType::RootPort, PortType::SwitchUpstream,
         PortType::SwitchDownstream, PortType::PcieToPciBridge, PortType::PciToPcieBridge,
         PortType::RootComplexEndpoint, PortType::RootComplexEventCollector},
        port_type_name, source);
  }
  dev.config_readable = raw["config_readable"].boolean();
  const JsonValue& link = raw["link"];
  if (!link.is_null()) {
    dev.link.speed_gts = optional_number<double>(link["speed_gts"]);
    dev.link.max_speed_gts = optional_number<double>(link["max_speed_gts"]);
    dev.link.width = optional_number<int>(link["width"]);
    dev.link.max_width = optional_number<int>(link["max_width"]);
    dev.link.from_config = link["source"].string() == "config";
  }
  for (const JsonValue& item : raw["bars"].array()) {
    Bar bar;
    bar.index = static_cast<int>(item["index"].integer());
    bar.start = static_cast<uint64_t>(item["start"].number());
    bar.size = static_cast<uint64_t>(item["size"].number());
    bar.is_64bit = item["is_64bit"].boolean();
    bar.prefetchable = item["prefetchable"].boolean();
    bar.is_io = item["io"].boolean();
    dev.bars.push_back(bar);
  }
  dev.bars_known = !dev.bars.empty();
  if (!raw["acs"].is_null()) {
    AcsRegisters acs;
    acs.capability = static_cast<uint16_t>(raw["acs"]["capability"].integer());
    acs.control = static_cast<uint16_t>(raw["acs"]["control"].integer());
    dev.config.acs = acs;
  }
  dev.net_interfaces = string_list(raw["net"]);
  dev.ib_devices = string_list(raw["infiniband"]);
  dev.nvme_controllers = string_list(raw["nvme_controllers"]);
  dev.block_devices = string_list(raw["block_devices"]);
  if (dev.kind == DeviceKind::Gpu && !raw["bar0"].is_null()) {
    const JsonValue& bar0 = raw["bar0"];
    Bar0Probe probe;
    probe.state =
        named(bar0["state"],
              {Bar0State::Mapped, Bar0State::Denied, Bar0State::Unavailable, Bar0State::Failed},
              bar0_state_name, source);
    probe.err = bar0["errno"].is_null() ? 0 : errno_from_name(bar0["errno"].string());
    probe.boot0 =
        bar0["boot0"].is_null() ? 0 : static_cast<uint32_t>(hex_value(bar0["boot0"], source));
    probe.chip = bar0["chip"].string();
    probe.architecture = bar0["architecture"].string();
    dev.bar0 = probe;
  }
  return dev;
}

}  // namespace

Topology topology_from_json(std::string_view text, const std::string& source) {
  JsonValue doc = parse_json(text, source);
  Topology topo;
  topo.sysfs_root = doc["sysfs_root"].string();
  topo.scan_seconds = doc["scan_seconds"].number();
  topo.numa_nodes = static_cast<int>(doc["numa_nodes"].integer());
  for (const JsonValue& raw : doc["devices"].array()) {
    topo.devices.push_back(device_from_json(raw, source));
  }
  const JsonValue& matrix = doc["matrix"];
  for (const JsonValue& bdf : matrix["devices"].array()) {
    auto found = std::find_if(topo.devices.begin(), topo.devices.end(),
                              [&](const PciDevice& dev) { return dev.bdf == bdf.string(); });
    if (found == topo.devices.end()) {
      throw InputError(source, 0, "matrix device " + bdf.string() + " is not among the devices");
    }
    topo.matrix.members.push_back(static_cast<size_t>(found - topo.devices.begin()));
  }
  topo.matrix.labels = string_list(matrix["labels"]);
  for (const JsonValue& row : matrix["rows"].array()) {
    std::vector<Level> levels;
    for (const JsonValue& cell : row.array()) {
      levels.push_back(
          named(cell, {Level::Self, Level::Pix, Level::Pxb, Level::Phb, Level::Node, Level::Sys},
                level_name, source));
    }
    topo.matrix.rows.push_back(levels);
  }
  if (!matrix["nvlinks"].is_null()) {
    for (const JsonValue& row : matrix["nvlinks"].array()) {
      std::vector<int> counts;
      for (const JsonValue& cell : row.array()) counts.push_back(static_cast<int>(cell.integer()));
      topo.matrix.nvlinks.push_back(counts);
    }
  }
  size_t members = topo.matrix.members.size();
  bool square = topo.matrix.labels.size() == members && topo.matrix.rows.size() == members;
  for (const auto& row : topo.matrix.rows) square = square && row.size() == members;
  if (!square) throw InputError(source, 0, "the matrix is not square over its devices");
  for (const JsonValue& raw : doc["findings"].array()) {
    Finding finding;
    finding.severity = named(raw["severity"], {Severity::Info, Severity::Warning, Severity::Error},
                             severity_name, source);
    finding.code = raw["code"].string();
    finding.device = raw["device"].string();
    finding.message = raw["message"].string();
    topo.findings.push_back(finding);
  }
  return topo;
}

}  // namespace pod_init
