#include "topology/topology.hpp"

#include <algorithm>
#include <set>

#include "common/clock.hpp"
#include "common/error.hpp"
#include "topology/detail/topology_checks.hpp"

namespace pod_init {

namespace {

size_t common_prefix(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

double monotonic_seconds() { return static_cast<double>(monotonic_ns()) * 1e-9; }

}  // namespace

const char* level_name(Level level) {
  switch (level) {
    case Level::Self:
      return "X";
    case Level::Pix:
      return "PIX";
    case Level::Pxb:
      return "PXB";
    case Level::Phb:
      return "PHB";
    case Level::Node:
      return "NODE";
    case Level::Sys:
      return "SYS";
  }
  return "SYS";
}

std::string matrix_cell(const Matrix& matrix, size_t row, size_t column) {
  if (!matrix.nvlinks.empty() && matrix.nvlinks[row][column] > 0) {
    return "NV" + std::to_string(matrix.nvlinks[row][column]);
  }
  return level_name(matrix.rows[row][column]);
}

DeviceIndex index_by_bdf(const std::vector<PciDevice>& devices) {
  DeviceIndex index;
  for (const PciDevice& dev : devices) index[dev.bdf] = &dev;
  return index;
}

PortType port_type_by_position(size_t position) {
  if (position == 0) return PortType::RootPort;
  return position % 2 == 1 ? PortType::SwitchUpstream : PortType::SwitchDownstream;
}

std::string switch_of(const std::vector<std::string>& chain, size_t position,
                      const DeviceIndex& index) {
  auto found = index.find(chain[position]);
  const PciDevice* bridge = found == index.end() ? nullptr : found->second;
  bool known = bridge != nullptr && bridge->config.port_type;
  switch (known ? *bridge->config.port_type : port_type_by_position(position)) {
    case PortType::RootPort:
      return "";
    case PortType::SwitchDownstream:
      return position > 0 ? chain[position - 1] : chain[position];
    default:
      return chain[position];
  }
}

std::vector<std::string> bridges_between(const PciDevice& a, const PciDevice& b) {
  std::vector<std::string> bridges;
  if (a.root_bus != b.root_bus) {
    bridges = a.upstream;
    bridges.insert(bridges.end(), b.upstream.begin(), b.upstream.end());
    return bridges;
  }
  size_t shared = common_prefix(a.upstream, b.upstream);
  if (shared > 0) bridges.push_back(a.upstream[shared - 1]);
  bridges.insert(bridges.end(), a.upstream.begin() + static_cast<long>(shared), a.upstream.end());
  bridges.insert(bridges.end(), b.upstream.begin() + static_cast<long>(shared), b.upstream.end());
  return bridges;
}

Level classify(const PciDevice& a, const PciDevice& b, const DeviceIndex& index) {
  if (a.bdf == b.bdf) return Level::Self;
  if (a.root_bus != b.root_bus) {
    // Unknown placement (-1) cannot prove a socket crossing.
    bool other_socket = a.numa_node >= 0 && b.numa_node >= 0 && a.numa_node != b.numa_node;
    return other_socket ? Level::Sys : Level::Node;
  }
  size_t shared = common_prefix(a.upstream, b.upstream);
  if (shared == 0) return Level::Phb;
  std::set<std::string> switches;
  auto add = [&](const std::vector<std::string>& chain, size_t from) {
    for (size_t i = from; i < chain.size(); ++i) {
      std::string name = switch_of(chain, i, index);
      if (!name.empty()) switches.insert(name);
    }
  };
  add(a.upstream, shared - 1);
  add(b.upstream, shared);
  return switches.size() <= 1 ? Level::Pix : Level::Pxb;
}

LinkCapability link_capability(const PciDevice& dev, const DeviceIndex& index) {
  LinkCapability cap;
  cap.speed_gts = dev.link.max_speed_gts.value_or(dev.link.speed_gts.value_or(0));
  if (!dev.upstream.empty()) {
    auto port = index.find(dev.upstream.back());
    if (port != index.end() && port->second->link.max_speed_gts) {
      cap.speed_gts = std::min(cap.speed_gts, *port->second->link.max_speed_gts);
    }
  }
  cap.width = dev.link.width.value_or(dev.link.max_width.value_or(0));
  return cap;
}

Matrix build_matrix(const std::vector<PciDevice>& devices) {
  Matrix matrix;
  DeviceIndex index = index_by_bdf(devices);
  // GPUs, then NICs, then NVMe, each in BDF order (devices are sorted), as nvidia-smi lists them.
  const std::pair<DeviceKind, const char*> groups[] = {
      {DeviceKind::Gpu, "GPU"}, {DeviceKind::Nic, "NIC"}, {DeviceKind::Nvme, "NVME"}};
  for (const auto& [kind, prefix] : groups) {
    int count = 0;
    for (size_t i = 0; i < devices.size(); ++i) {
      if (devices[i].kind != kind) continue;
      matrix.members.push_back(i);
      matrix.labels.push_back(prefix + std::to_string(count++));
    }
  }
  for (size_t row : matrix.members) {
    std::vector<Level> levels;
    for (size_t column : matrix.members) {
      levels.push_back(classify(devices[row], devices[column], index));
    }
    matrix.rows.push_back(std::move(levels));
  }
  return matrix;
}

Topology scan(const ScanOptions& options) {
  double started = monotonic_seconds();
  Topology topo;
  topo.sysfs_root = options.sysfs_root;
  PciScanOptions pci_options{options.sysfs_root, options.probe_bar0};
  int rc = scan_pci_devices(pci_options, &topo.devices, &topo.findings);
  if (rc < 0) throw SysError(-rc, "list", options.sysfs_root + "/bus/pci/devices");
  topo.numa_nodes = count_numa_nodes(options.sysfs_root);
  topo.matrix = build_matrix(topo.devices);

  DeviceIndex index = index_by_bdf(topo.devices);
  check_gpu_count(topo.devices, options.expect_gpus, &topo.findings);
  check_links(topo.devices, index, &topo.findings);
  check_bar1(topo.devices, &topo.findings);
  check_acs(topo.devices, index, &topo.findings);
  check_numa(topo.devices, topo.numa_nodes, &topo.findings);
  check_config_access(topo.devices, &topo.findings);
  std::stable_sort(topo.findings.begin(), topo.findings.end(),
                   [](const Finding& x, const Finding& y) { return x.severity > y.severity; });
  topo.scan_seconds = monotonic_seconds() - started;
  return topo;
}

void expect_gpus(Topology* topo, int expect_gpus) {
  auto& findings = topo->findings;
  findings.erase(
      std::remove_if(findings.begin(), findings.end(),
                     [](const Finding& f) { return f.code == finding_code::kGpuCountLow; }),
      findings.end());
  check_gpu_count(topo->devices, expect_gpus, &findings);
}

}  // namespace pod_init
