#include "nccl/detail/topo_hints.hpp"

#include <algorithm>
#include <cstdio>
#include <set>

#include "common/sysfs.hpp"

namespace pod_init {

namespace {

std::string hint_switch_busid(size_t index) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "ffff:ff:%02zx.0", index + 1);
  return buf;
}

}  // namespace

int parse_topo_hints(std::string_view text, TopoHints* hints, LineError* error) {
  *hints = {};
  std::map<std::string, int> switch_line;  // BDF -> the switch line that named it
  return for_each_fields_line(text, [&](int line, const std::vector<std::string>& fields) {
    const std::string& keyword = fields[0];
    size_t first_bdf = keyword == "numa" ? 2 : 1;
    if (keyword != "numa" && keyword != "switch") {
      return fail_line(error, line, "unknown keyword '" + keyword + "' (expected numa or switch)");
    }
    if (fields.size() <= first_bdf) {
      return fail_line(
          error, line,
          keyword == "numa" ? "expected: numa NODE BDF..." : "expected: switch BDF...");
    }
    int node = -1;
    if (keyword == "numa") {
      auto parsed = sysfs::parse_int(fields[1]);
      if (!parsed || *parsed < 0 || *parsed > 1023) {
        return fail_line(error, line,
                         "NUMA node must be a whole number from 0 to 1023: '" + fields[1] + "'");
      }
      node = static_cast<int>(*parsed);
    }
    std::vector<std::string> members;
    for (size_t i = first_bdf; i < fields.size(); ++i) {
      std::string bdf = fields[i];
      std::transform(bdf.begin(), bdf.end(), bdf.begin(), ::tolower);
      if (!sysfs::is_bdf(bdf)) {
        return fail_line(error, line, "'" + fields[i] + "' is not a PCI address (DDDD:BB:DD.F)");
      }
      std::map<std::string, int>& seen = keyword == "numa" ? hints->numa_line : switch_line;
      auto earlier = seen.find(bdf);
      if (earlier != seen.end()) {
        return fail_line(
            error, line,
            bdf + " is already in a " + keyword + " on line " + std::to_string(earlier->second));
      }
      seen[bdf] = line;
      if (keyword == "numa") hints->numa[bdf] = node;
      members.push_back(bdf);
    }
    if (keyword == "switch") {
      if (hints->switches.size() == kMaxHintSwitches) {
        return fail_line(error, line, "more than 32 switches");
      }
      hints->switches.push_back({hint_switch_busid(hints->switches.size()), members, line});
    }
    return 0;
  });
}

int check_topo_hints(const TopoHints& hints, const std::vector<PciDevice>& devices,
                     LineError* error) {
  DeviceIndex index = index_by_bdf(devices);
  auto check_device = [&](const std::string& bdf, int line) {
    auto found = index.find(bdf);
    if (found == index.end()) return fail_line(error, line, bdf + ": no such PCI device");
    DeviceKind kind = found->second->kind;
    if (kind != DeviceKind::Gpu && kind != DeviceKind::Nic) {
      return fail_line(error, line, bdf + ": a " + device_kind_name(kind) + ", not a GPU or NIC");
    }
    return 0;
  };
  for (const auto& [bdf, line] : hints.numa_line) {
    if (int rc = check_device(bdf, line); rc < 0) return rc;
  }
  for (const HintSwitch& sw : hints.switches) {
    std::set<int> nodes;
    for (const std::string& bdf : sw.members) {
      if (int rc = check_device(bdf, sw.line); rc < 0) return rc;
      auto placed = hints.numa.find(bdf);
      nodes.insert(placed != hints.numa.end() ? placed->second : index.at(bdf)->numa_node);
    }
    if (nodes.size() > 1) {
      return fail_line(error, sw.line, "the switch's devices are on different NUMA nodes");
    }
  }
  return 0;
}

void apply_topo_hints(const TopoHints& hints, Topology* topo) {
  std::vector<PciDevice>& devices = topo->devices;
  for (PciDevice& dev : devices) {
    auto placed = hints.numa.find(dev.bdf);
    if (placed != hints.numa.end()) dev.numa_node = placed->second;
  }
  for (const HintSwitch& sw : hints.switches) {
    PciDevice bridge;
    bridge.bdf = sw.busid;
    bridge.kind = DeviceKind::Bridge;
    bridge.class_code = 0x060400;
    bridge.config.port_type = PortType::SwitchUpstream;
    for (PciDevice& dev : devices) {
      if (std::find(sw.members.begin(), sw.members.end(), dev.bdf) == sw.members.end()) continue;
      // The switch hangs where its first member did, and is as fast as its fastest member.
      if (bridge.root_bus.empty()) bridge.root_bus = dev.root_bus;
      bridge.numa_node = dev.numa_node;
      bridge.local_cpulist = dev.local_cpulist;
      if (dev.link.max_speed_gts.value_or(0) > bridge.link.max_speed_gts.value_or(0)) {
        bridge.link = dev.link;
      }
      dev.root_bus = bridge.root_bus;
      dev.upstream = {sw.busid};
    }
    devices.push_back(bridge);
  }
  topo->matrix = build_matrix(devices);
}

}  // namespace pod_init
