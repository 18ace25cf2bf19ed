#include "nccl/detail/nccl_xml.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>

#include "common/line_input.hpp"
#include "common/sysfs.hpp"

namespace pod_init {

namespace {

std::string xml_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string hex_attr(uint32_t value, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*x", digits, value);
  return buf;
}

std::string format_gbs(double gbs) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", gbs);
  return buf;
}

// One element: name, attributes in order, children.
struct Element {
  std::string name;
  std::vector<std::pair<std::string, std::string>> attrs;
  std::vector<Element> children;

  Element& attr(const std::string& key, const std::string& value) {
    attrs.emplace_back(key, value);
    return *this;
  }
  Element& attr(const std::string& key, int value) { return attr(key, std::to_string(value)); }
};

void render(const Element& e, int depth, std::string* out) {
  out->append(static_cast<size_t>(depth) * 2, ' ');
  *out += "<" + e.name;
  for (const auto& [key, value] : e.attrs) *out += " " + key + "=\"" + xml_escape(value) + "\"";
  if (e.children.empty()) {
    *out += "/>\n";
    return;
  }
  *out += ">\n";
  for (const Element& child : e.children) render(child, depth + 1, out);
  out->append(static_cast<size_t>(depth) * 2, ' ');
  *out += "</" + e.name + ">\n";
}

// A pci element as NCCL's sysfs reader would fill it, but with the link's
// trained width where NCCL takes the capability (link_capability()).
Element pci_element(const PciDevice& dev, const DeviceIndex& index) {
  LinkCapability link = link_capability(dev, index);
  Element pci{"pci", {}, {}};
  pci.attr("busid", dev.bdf).attr("class", hex_attr(dev.class_code, 6));
  if (dev.vendor != 0) pci.attr("vendor", hex_attr(dev.vendor, 4));
  if (dev.device != 0) pci.attr("device", hex_attr(dev.device, 4));
  pci.attr("link_speed", link.speed_gts > 0 ? nccl_link_speed(link.speed_gts) : "Unknown speed");
  return pci.attr("link_width", link.width);
}

std::string net_name(const PciDevice& dev) {
  if (!dev.ib_devices.empty()) return dev.ib_devices.front();
  return dev.net_interfaces.empty() ? "" : dev.net_interfaces.front();
}

// Switches above a device, top first, each named by its upstream port.
std::vector<std::string> switch_chain(const PciDevice& dev, const DeviceIndex& index) {
  std::vector<std::string> chain;
  for (size_t i = 0; i < dev.upstream.size(); ++i) {
    std::string name = switch_of(dev.upstream, i, index);
    if (!name.empty() && (chain.empty() || chain.back() != name)) chain.push_back(name);
  }
  return chain;
}

Element* child_pci(Element* parent, const std::string& busid) {
  for (Element& child : parent->children) {
    if (child.name == "pci" && !child.attrs.empty() && child.attrs[0].second == busid) {
      return &child;
    }
  }
  return nullptr;
}

bool same_channels(const RingGraph& graph) {
  for (const GraphChannel& channel : graph.channels) {
    const GraphChannel& first = graph.channels.front();
    if (channel.net != first.net || channel.gpus != first.gpus) return false;
  }
  return true;
}

}  // namespace

CpuIdentity parse_cpuinfo(std::string_view text) {
  CpuIdentity cpu;
  for_each_line(text, [&](int, std::string_view line) {
    if (line.empty()) return 1;  // the first processor's block is enough
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) return 0;
    std::string key(line.substr(0, colon));
    key.erase(key.find_last_not_of(" \t") + 1);
    std::string value(line.substr(colon + 1));
    value.erase(0, value.find_first_not_of(" \t"));
    if (key == "vendor_id") {
      cpu.arch = "x86_64";
      cpu.vendor = value;
    } else if (key == "cpu family") {
      cpu.family = static_cast<int>(sysfs::parse_int(value).value_or(-1));
    } else if (key == "model") {
      cpu.model = static_cast<int>(sysfs::parse_int(value).value_or(-1));
    } else if (key == "CPU implementer") {
      cpu.arch = "arm64";
    } else if (key == "cpu" && value.rfind("POWER", 0) == 0) {
      cpu.arch = "ppc64";
    }
    return 0;
  });
  return cpu;
}

std::string cpulist_to_mask(std::string_view cpulist) {
  std::set<int> cpus;
  size_t start = 0;
  while (start <= cpulist.size()) {
    size_t comma = cpulist.find(',', start);
    if (comma == std::string_view::npos) comma = cpulist.size();
    std::string_view range = cpulist.substr(start, comma - start);
    start = comma + 1;
    while (!range.empty() && (range.back() == '\n' || range.back() == ' ')) range.remove_suffix(1);
    if (range.empty()) continue;
    size_t dash = range.find('-');
    auto low = sysfs::parse_int(range.substr(0, dash));
    auto high = dash == std::string_view::npos ? low : sysfs::parse_int(range.substr(dash + 1));
    if (!low || !high || *low < 0 || *high < *low || *high >= 65536) return "";
    for (int64_t c = *low; c <= *high; ++c) cpus.insert(static_cast<int>(c));
  }
  if (cpus.empty()) return "";
  int words = *cpus.rbegin() / 32 + 1;
  std::string out;
  for (int w = words - 1; w >= 0; --w) {
    uint32_t bits = 0;
    for (int b = 0; b < 32; ++b) bits |= cpus.count(w * 32 + b) ? (1u << b) : 0;
    char buf[12];
    std::snprintf(buf, sizeof buf, "%08x", bits);
    out += (out.empty() ? "" : ",") + std::string(buf);
  }
  return out;
}

std::string nccl_link_speed(double speed_gts) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GT/s PCIe", speed_gts);
  return buf;
}

std::vector<std::string> nccl_net_names(const Topology& topo) {
  std::vector<std::string> names;
  for (size_t member : topo.matrix.members) {
    const PciDevice& dev = topo.devices[member];
    std::string name = dev.kind == DeviceKind::Nic ? net_name(dev) : "";
    if (!name.empty()) names.push_back(name);
  }
  return names;
}

std::string nccl_topo_xml(const Topology& topo, const GpuDetailsMap& details,
                          const TopoXmlOptions& options) {
  DeviceIndex index = index_by_bdf(topo.devices);
  Element system{"system", {{"version", "1"}}, {}};
  std::map<int, Element> cpus;  // by NUMA node
  int gpu_index = 0;
  for (size_t member : topo.matrix.members) {
    const PciDevice& dev = topo.devices[member];
    bool gpu = dev.kind == DeviceKind::Gpu;
    if (!gpu && (dev.kind != DeviceKind::Nic || net_name(dev).empty())) continue;

    auto [slot, created] = cpus.try_emplace(dev.numa_node);
    Element* parent = &slot->second;
    if (created) {
      Element& cpu = *parent;
      cpu.name = "cpu";
      cpu.attr("numaid", dev.numa_node);
      std::string mask = dev.numa_node >= 0 ? cpulist_to_mask(dev.local_cpulist) : "";
      if (!mask.empty()) cpu.attr("affinity", mask);
      if (!options.cpu.arch.empty()) cpu.attr("arch", options.cpu.arch);
      if (!options.cpu.vendor.empty()) cpu.attr("vendor", options.cpu.vendor);
      if (options.cpu.family >= 0) cpu.attr("familyid", options.cpu.family);
      if (options.cpu.model >= 0) cpu.attr("modelid", options.cpu.model);
    }
    for (const std::string& sw : switch_chain(dev, index)) {
      Element* existing = child_pci(parent, sw);
      if (existing == nullptr) {
        auto bridge = index.find(sw);
        parent->children.push_back(bridge != index.end() ? pci_element(*bridge->second, index)
                                                         : Element{"pci", {{"busid", sw}}, {}});
        existing = &parent->children.back();
      }
      parent = existing;
    }
    Element pci = pci_element(dev, index);
    if (gpu) {
      Element element{"gpu", {}, {}};
      element.attr("dev", gpu_index).attr("rank", options.first_rank + gpu_index);
      ++gpu_index;
      auto found = details.find(dev.bdf);
      const GpuDetails* extra = found == details.end() ? nullptr : &found->second;
      if (extra && extra->sm > 0) element.attr("sm", extra->sm);
      if (options.gpudirect_known) element.attr("gdr", 1);
      for (const NvLinkGroup& group : extra ? extra->nvlinks : std::vector<NvLinkGroup>{}) {
        bool to_gpu = group.peer == NvLinkPeer::Gpu;
        element.children.push_back(Element{"nvlink",
                                           {{"target", to_gpu ? group.target : kNvSwitchTarget},
                                            {"count", std::to_string(group.count)},
                                            {"tclass", to_gpu ? "0x030200" : "0x068000"}},
                                           {}});
      }
      pci.children.push_back(element);
    } else {
      pci.children.push_back(Element{"nic", {}, {Element{"net", {{"name", net_name(dev)}}, {}}}});
    }
    parent->children.push_back(pci);
  }
  for (auto& [numa, cpu] : cpus) system.children.push_back(cpu);
  std::string out;
  render(system, 0, &out);
  return out;
}

std::string nccl_graph_xml(const RingGraph& graph) {
  Element graphs{"graphs", {{"version", "1"}}, {}};
  Element ring{"graph", {}, {}};
  ring.attr("id", 0)
      .attr("pattern", 4)
      .attr("crossnic", 0)
      .attr("nchannels", static_cast<int>(graph.channels.size()))
      .attr("speedintra", format_gbs(graph.speed_intra_gbs))
      .attr("speedinter", format_gbs(graph.speed_inter_gbs))
      .attr("latencyinter", 0)
      .attr("typeintra", graph.type_intra)
      .attr("typeinter", graph.type_inter)
      .attr("samechannels", same_channels(graph) ? 1 : 0);
  for (const GraphChannel& channel : graph.channels) {
    Element element{"channel", {}, {}};
    if (channel.net >= 0)
      element.children.push_back(Element{"net", {{"dev", std::to_string(channel.net)}}, {}});
    for (int gpu : channel.gpus) {
      element.children.push_back(Element{"gpu", {{"dev", std::to_string(gpu)}}, {}});
    }
    if (channel.net >= 0)
      element.children.push_back(Element{"net", {{"dev", std::to_string(channel.net)}}, {}});
    ring.children.push_back(element);
  }
  graphs.children.push_back(ring);
  std::string out;
  render(graphs, 0, &out);
  return out;
}

}  // namespace pod_init
