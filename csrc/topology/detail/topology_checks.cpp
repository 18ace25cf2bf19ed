#include "topology/detail/topology_checks.hpp"

#include <algorithm>
#include <cstdio>
#include <map>

namespace pod_init {

namespace {

// Root and downstream ports report the link to their child, which is checked
// at the child; this keeps one finding per physical link.
bool reports_own_upstream_link(const PciDevice& dev) {
  std::optional<PortType> type = dev.config.port_type;
  if (!type && dev.kind == DeviceKind::Bridge) type = port_type_by_position(dev.upstream.size());
  return !type || (*type != PortType::RootPort && *type != PortType::SwitchDownstream);
}

const PciDevice* parent_of(const PciDevice& dev, const DeviceIndex& index) {
  if (dev.upstream.empty()) return nullptr;
  auto found = index.find(dev.upstream.back());
  return found == index.end() ? nullptr : found->second;
}

}  // namespace

void check_links(const std::vector<PciDevice>& devices, const DeviceIndex& index,
                 std::vector<Finding>* findings) {
  for (const PciDevice& dev : devices) {
    if (!reports_own_upstream_link(dev)) continue;
    const LinkInfo& link = dev.link;
    const PciDevice* parent = parent_of(dev, index);
    // The link trains to the lesser of both ends; a x4 drive in a x16 slot is not degraded.
    if (link.width && link.max_width && *link.width > 0) {
      int capable = *link.max_width;
      if (parent && parent->link.max_width && *parent->link.max_width > 0) {
        capable = std::min(capable, *parent->link.max_width);
      }
      if (*link.width < capable) {
        findings->push_back({Severity::Error, finding_code::kLinkWidthDegraded, dev.bdf,
                             std::string(device_kind_name(dev.kind)) + " link trained to x" +
                                 std::to_string(*link.width) + ", both ends support x" +
                                 std::to_string(capable)});
      }
    }
    if (link.speed_gts && link.max_speed_gts) {
      double capable = *link.max_speed_gts;
      if (parent && parent->link.max_speed_gts) {
        capable = std::min(capable, *parent->link.max_speed_gts);
      }
      if (*link.speed_gts < capable) {
        bool gpu = dev.kind == DeviceKind::Gpu;
        // GPUs drop their link speed when idle to save power: only load tells.
        findings->push_back(
            {gpu ? Severity::Info : Severity::Warning, finding_code::kLinkSpeedDegraded, dev.bdf,
             std::string(device_kind_name(dev.kind)) + " link at " +
                 format_link_speed(*link.speed_gts) + ", both ends support " +
                 format_link_speed(capable) +
                 (gpu ? " (an idle GPU lowers its link speed; check under load)" : "")});
      }
    }
  }
}

void check_bar1(const std::vector<PciDevice>& devices, std::vector<Finding>* findings) {
  for (const PciDevice& dev : devices) {
    if (dev.kind != DeviceKind::Gpu || !dev.bars_known) continue;
    const Bar* bar1 = nvidia_bar1(dev.bars);
    if (bar1 == nullptr) {
      findings->push_back({Severity::Error, finding_code::kBar1Small, dev.bdf,
                           "BAR1 is not assigned (enable above-4G decoding and resizable BAR)"});
    } else if (bar1->size < kMinBar1Bytes) {
      findings->push_back({Severity::Error, finding_code::kBar1Small, dev.bdf,
                           "BAR1 is " + format_bar_size(bar1->size) +
                               ", below 1 GiB: no large BAR, GPUDirect RDMA cannot map memory"});
    }
  }
}

void check_acs(const std::vector<PciDevice>& devices, const DeviceIndex& index,
               std::vector<Finding>* findings) {
  std::map<std::string, std::vector<std::string>> pairs_by_bridge;
  for (size_t i = 0; i < devices.size(); ++i) {
    if (devices[i].kind != DeviceKind::Gpu) continue;
    for (size_t j = 0; j < devices.size(); ++j) {
      const PciDevice& peer = devices[j];
      bool counted = (peer.kind == DeviceKind::Gpu && j > i) || peer.kind == DeviceKind::Nic;
      // Only traffic that would otherwise stay below the host bridge is diverted.
      if (!counted || classify(devices[i], peer, index) > Level::Pxb) continue;
      for (const std::string& bdf : bridges_between(devices[i], peer)) {
        auto bridge = index.find(bdf);
        if (bridge == index.end() || !bridge->second->config.acs ||
            !bridge->second->config.acs->redirects_peer_traffic()) {
          continue;
        }
        auto& pairs = pairs_by_bridge[bdf];
        std::string pair = devices[i].bdf + "<->" + peer.bdf;
        if (std::find(pairs.begin(), pairs.end(), pair) == pairs.end()) pairs.push_back(pair);
      }
    }
  }
  for (const auto& [bdf, pairs] : pairs_by_bridge) {
    char control[16];
    std::snprintf(control, sizeof control, "0x%04x", index.at(bdf)->config.acs->control);
    std::string listed;
    for (size_t k = 0; k < pairs.size() && k < 4; ++k) listed += (k ? ", " : "") + pairs[k];
    if (pairs.size() > 4) listed += ", ...";
    findings->push_back({Severity::Error, finding_code::kAcsRedirect, bdf,
                         "ACS control " + std::string(control) +
                             " redirects peer-to-peer traffic to the root complex for " +
                             std::to_string(pairs.size()) + " GPU pair(s): " + listed});
  }
}

void check_numa(const std::vector<PciDevice>& devices, int numa_nodes,
                std::vector<Finding>* findings) {
  for (const PciDevice& dev : devices) {
    bool placed_kind =
        dev.kind == DeviceKind::Gpu || dev.kind == DeviceKind::Nic || dev.kind == DeviceKind::Nvme;
    if (!placed_kind || dev.numa_node >= 0) continue;
    // With one NUMA node there is nothing to get wrong; with several, CPU and
    // memory binding for this device is guesswork.
    findings->push_back(
        {numa_nodes > 1 ? Severity::Warning : Severity::Info, finding_code::kNumaUnknown, dev.bdf,
         std::string(device_kind_name(dev.kind)) + " reports NUMA node -1 (the node has " +
             std::to_string(numa_nodes) + " NUMA node(s))"});
  }
}

void check_config_access(const std::vector<PciDevice>& devices, std::vector<Finding>* findings) {
  std::vector<const PciDevice*> blind;
  for (const PciDevice& dev : devices) {
    bool pci_bridge = dev.kind == DeviceKind::Bridge && (dev.class_code >> 8) != 0x0600;
    if (pci_bridge && !dev.config.port_type) blind.push_back(&dev);
  }
  if (blind.empty()) return;
  findings->push_back(
      {Severity::Info, finding_code::kConfigUnreadable, blind.front()->bdf,
       "config space of " + std::to_string(blind.size()) +
           " bridge(s) not readable past the header (run as root for all of it): switches are "
           "grouped by position (root port, then upstream/downstream pairs) and ACS is not "
           "checked"});
}

void check_gpu_count(const std::vector<PciDevice>& devices, int expect_gpus,
                     std::vector<Finding>* findings) {
  if (expect_gpus < 0) return;
  auto gpus = std::count_if(devices.begin(), devices.end(),
                            [](const PciDevice& d) { return d.kind == DeviceKind::Gpu; });
  if (gpus < expect_gpus) {
    findings->push_back(
        {Severity::Error, finding_code::kGpuCountLow, "",
         "found " + std::to_string(gpus) + " GPU(s), expected " + std::to_string(expect_gpus)});
  }
}

}  // namespace pod_init
