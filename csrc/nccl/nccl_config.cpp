#include "nccl/nccl_config.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>

#include "common/atomic_file.hpp"
#include "common/error.hpp"
#include "common/line_input.hpp"
#include "common/sysfs.hpp"
#include "nccl/detail/nccl_xml.hpp"
#include "nccl/detail/rings.hpp"
#include "nccl/detail/topo_hints.hpp"
#include "nccl/netif.hpp"

namespace pod_init {

namespace {

// What NCCL's own search gives one ring channel before it doubles the channels
// (sm90: 30 GB/s over NVLink, 24 over PCIe): the same count keeps a forced
// graph as wide as NCCL's choice (12 channels, doubled to 24, on 2xH200).
constexpr double kNvLinkChannelGbs = 30.0;
constexpr double kPcieChannelGbs = 24.0;
constexpr int kMaxGraphChannels = 16;  // NCCL doubles them, to at most 32

std::string absolute(const std::string& dir) {
  if (!dir.empty() && dir.front() == '/') return dir;
  char cwd[PATH_MAX];
  if (getcwd(cwd, sizeof cwd) == nullptr) throw SysError(errno, "getcwd");
  return dir == "." ? cwd : std::string(cwd) + "/" + dir;
}

// NCCL's path names: it has no NODE (a host bridge crossing is PHB).
const char* nccl_path_type(Level level) {
  switch (level) {
    case Level::Self:
      return "LOC";
    case Level::Pix:
      return "PIX";
    case Level::Pxb:
      return "PXB";
    case Level::Phb:
    case Level::Node:
      return "PHB";
    case Level::Sys:
      return "SYS";
  }
  return "SYS";
}

const char* nccl_path_type(const RingHop& hop) {
  return hop.nvlinks > 0 ? "NVL" : nccl_path_type(hop.level);
}

int path_rank(const std::string& type) {
  const char* order[] = {"LOC", "NVL", "PIX", "PXB", "PHB", "SYS"};
  for (int i = 0; i < 6; ++i) {
    if (type == order[i]) return i;
  }
  return 5;
}

std::string hop_name(const RingHop& hop) {
  return hop.nvlinks > 0 ? "NV" + std::to_string(hop.nvlinks) : level_name(hop.level);
}

void apply_hints(const NcclRequest& request, NcclConfig* config) {
  if (!request.hints) return;
  LineError error;
  if (check_topo_hints(*request.hints, config->topo.devices, &error) < 0) {
    throw InputError(request.hints_source, error.line, error.message);
  }
  apply_topo_hints(*request.hints, &config->topo);
  config->hinted = true;
}

void build_graph(const NcclRequest& request, NcclConfig* config) {
  const HopMatrix& hops = config->hops;
  const RingPlan& ring = config->ring;
  RingGraph& graph = config->graph;
  int channels = request.channels;
  double bottleneck = ring.order.size() > 1 ? ring.cost.bottleneck_gbs : 0;
  std::string worst = "NVL";
  for (size_t i = 0; i < ring.order.size() && ring.order.size() > 1; ++i) {
    const RingHop& hop = hops[ring.order[i]][ring.order[(i + 1) % ring.order.size()]];
    if (path_rank(nccl_path_type(hop)) > path_rank(worst)) worst = nccl_path_type(hop);
  }
  graph.type_intra = ring.order.size() > 1 ? worst : "LOC";
  if (channels == 0) {
    double per_channel = worst == "NVL" ? kNvLinkChannelGbs : kPcieChannelGbs;
    channels = std::clamp(static_cast<int>(bottleneck / per_channel), 1, kMaxGraphChannels);
  }
  graph.speed_intra_gbs = graph.speed_inter_gbs = bottleneck / channels;
  graph.type_inter = "PIX";
  for (const RailCut& rail : config->rails) {
    if (path_rank(nccl_path_type(rail.worst)) > path_rank(graph.type_inter)) {
      graph.type_inter = nccl_path_type(rail.worst);
    }
  }
  for (int c = 0; c < channels; ++c) {
    GraphChannel channel;
    if (config->rails.empty()) {
      channel.gpus = ring.order;
    } else {
      const RailCut& rail = config->rails[static_cast<size_t>(c) % config->rails.size()];
      channel.net = rail.nic;
      channel.gpus = rail.order;
    }
    graph.channels.push_back(channel);
  }
}

bool valid_env_name(const std::string& key) {
  auto letter = [](char c) { return c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); };
  return !key.empty() && letter(key[0]) && std::all_of(key.begin(), key.end(), [&](char c) {
    return letter(c) || (c >= '0' && c <= '9');
  });
}

// nccl.env is sourced by shells and read a line at a time by NCCL: a newline
// or NUL in a value (from the environment or a tuning table) would add a line
// of its own, so such a setting is refused rather than written.
void check_env_setting(const std::string& key, const std::string& value, const char* from) {
  if (!valid_env_name(key)) {
    throw InputError("", 0, std::string(from) + ": '" + key + "' is not a variable name");
  }
  if (value.find_first_of(std::string("\n\r\0", 3)) != std::string::npos) {
    throw InputError("", 0,
                     std::string(from) + ": " + key +
                         " holds a newline or NUL byte; refused (it would add a line to nccl.env)");
  }
}

void propose(const NcclRequest& request, NcclConfig* config, const std::string& key,
             const std::string& value, const std::string& reason,
             const char* from = "pod-init's choice") {
  check_env_setting(key, value, from);
  EnvSetting setting{key, value, value, reason, false};
  auto set = request.environment.find(key);
  if (set != request.environment.end()) {
    check_env_setting(key, set->second, "the environment");
    setting.value = set->second;
    setting.from_environment = true;
  }
  config->env.push_back(setting);
}

// A value as the shell reads it back with `. FILE`: bare when every character
// is one the shell takes literally (what NCCL's own conf reader needs, as it
// does not unquote), else in single quotes.
std::string shell_word(const std::string& value) {
  bool plain = !value.empty() && std::all_of(value.begin(), value.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string_view("_-./:,=+@%^").find(c) != std::string_view::npos;
  });
  if (plain) return value;
  std::string quoted = "'";
  for (char c : value) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

void choose_socket_interface(const NcclRequest& request, NcclConfig* config) {
  bool multi_node = config->hosts.size() > 1;
  if (request.nodes.planned_elsewhere) {
    // Another machine's interfaces and routes are not here to look at.
    if (!request.socket_ifname.empty()) {
      propose(request, config, "NCCL_SOCKET_IFNAME", "=" + request.socket_ifname,
              "given with --socket-ifname");
    }
    return;
  }
  if (!request.socket_ifname.empty()) {
    if (!interface_exists(request.socket_ifname)) {
      throw InputError(
          "", 0, "--socket-ifname: no network interface named '" + request.socket_ifname + "'");
    }
    propose(request, config, "NCCL_SOCKET_IFNAME", "=" + request.socket_ifname,
            "given with --socket-ifname");
    return;
  }
  std::string master = multi_node ? config->hosts.front().address : "";
  std::string interface, source;
  int rc = route_interface(master, &interface, &source);
  if (rc < 0) {
    if (multi_node) {
      throw InputError(request.nodes.source, config->hosts.front().line,
                       "no route to the master " + master + ": " + errno_text(-rc));
    }
    propose(request, config, "NCCL_SOCKET_IFNAME", "=lo", "single node without a default route");
    return;
  }
  bool loopback = interface == "lo";
  bool bridge = is_container_bridge(interface, request.sys_class_net);
  if (multi_node && (loopback || bridge)) {
    throw InputError(request.nodes.source, config->hosts.front().line,
                     "the master " + master + " is reached through " + interface +
                         (loopback ? ", the loopback" : ", a container bridge") +
                         ": other nodes cannot connect there");
  }
  std::string why = multi_node ? "carries " + source + " -> master " + master
                               : "default route, source " + source + " (single node)";
  propose(request, config, "NCCL_SOCKET_IFNAME", "=" + interface, why);
}

std::string env_file(const NcclConfig& config) {
  std::string out = "# NCCL configuration from pod-init " POD_INIT_VERSION
                    "; usable as /etc/nccl.conf or with `set -a; . FILE`\n"
                    "# (a value quoted for the shell is for `. FILE` alone: NCCL keeps quotes).\n";
  for (const EnvSetting& setting : config.env) {
    if (setting.from_environment && setting.value != setting.proposed) {
      out += "# " + setting.key + " kept from the environment, not pod-init's choice\n";
    }
    out += setting.key + "=" + shell_word(setting.value) + "\n";
  }
  return out;
}

TopoHints read_topo_hints(const std::string& path) {
  std::string text = load_input_file(path);
  TopoHints hints;
  LineError error;
  if (parse_topo_hints(text, &hints, &error) < 0) throw InputError(path, error.line, error.message);
  return hints;
}

CpuIdentity read_cpu_identity(const std::string& proc_root) {
  std::string cpuinfo;
  if (sysfs::read_text(proc_root + "/cpuinfo", &cpuinfo) < 0) return {};
  return parse_cpuinfo(cpuinfo);
}

// GPUDirect RDMA works for sure with nvidia-peermem; without it NCCL may still
// use dma-buf, which only NCCL itself can test, so gdr is left to it.
bool gpudirect_loaded(const std::string& sysfs_root) {
  return access((sysfs_root + "/module/nvidia_peermem").c_str(), F_OK) == 0;
}

}  // namespace

NcclRequest make_nccl_request(Topology topo, const NcclSources& sources) {
  NcclRequest request;
  if (!sources.hints.empty()) {
    request.hints = read_topo_hints(sources.hints);
    request.hints_source = sources.hints;
  }
  request.cpu = read_cpu_identity(sources.proc_root);
  request.gpudirect_known = gpudirect_loaded(topo.sysfs_root);
  for (const auto& [key, value] : sources.environment) {
    if (key.rfind("NCCL_", 0) == 0) request.environment[key] = value;
  }
  request.topo = std::move(topo);
  return request;
}

std::map<std::string, std::string> process_environment() {
  std::map<std::string, std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    std::string_view text = *entry;
    size_t equals = text.find('=');
    if (equals != std::string_view::npos) {
      environment.emplace(text.substr(0, equals), text.substr(equals + 1));
    }
  }
  return environment;
}

NcclConfig build_nccl_config(const NcclRequest& request) {
  NcclConfig config;
  config.out_dir = absolute(request.out_dir);
  if (request.channels < 0 || request.channels > kMaxChannels) {
    throw InputError("", 0,
                     "--channels must be from 1 to " + std::to_string(kMaxChannels) + ", not " +
                         std::to_string(request.channels));
  }
  config.topo = request.topo;
  apply_hints(request, &config);
  if (!request.details.empty()) {
    merge_nvlinks(&config.topo, request.details);
    config.nvml = true;
  }
  int gpus = 0;
  for (const PciDevice& dev : config.topo.devices) gpus += dev.kind == DeviceKind::Gpu;
  if (gpus == 0) {
    throw InputError(config.topo.sysfs_root, 0,
                     "no GPU among the PCI devices under bus/pci/devices: no ring to build");
  }
  config.hosts = request.nodes.hosts;
  config.node_rank = request.nodes.node_rank;

  config.hops = gpu_hops(config.topo, request.details);
  config.ring = plan_ring(config.hops);
  config.nets = nccl_net_names(config.topo);
  if (config.hosts.size() > 1 && !config.nets.empty()) {
    // Matrix members: GPUs first, then NICs in the order nccl_net_names() lists them.
    std::vector<std::vector<Level>> gpu_to_nic;
    size_t first_nic = static_cast<size_t>(gpus);
    for (int g = 0; g < gpus; ++g) {
      std::vector<Level> row;
      for (size_t m = first_nic; m < config.topo.matrix.members.size(); ++m) {
        if (config.topo.devices[config.topo.matrix.members[m]].kind != DeviceKind::Nic) continue;
        row.push_back(config.topo.matrix.rows[g][m]);
      }
      row.resize(config.nets.size(), Level::Sys);
      gpu_to_nic.push_back(row);
    }
    config.rails = rail_cuts(config.ring.order, gpu_to_nic);
  }
  build_graph(request, &config);

  std::string topo_path = config.out_dir + "/nccl-topo.xml";
  propose(request, &config, "NCCL_TOPO_FILE", topo_path, "this node's PCIe tree");
  if (request.force_rings) {
    propose(request, &config, "NCCL_GRAPH_FILE", config.out_dir + "/nccl-graph.xml",
            "--force-rings: NCCL uses these rings unchecked");
  }
  choose_socket_interface(request, &config);
  for (const auto& [key, value] : request.tuned_env) {
    propose(request, &config, key, value, "measured on this kind of node (pyinit nccl --tune)",
            "the tuning table");
  }
  std::vector<std::string> hcas;
  for (const PciDevice& dev : config.topo.devices) {
    if (dev.kind == DeviceKind::Nic)
      hcas.insert(hcas.end(), dev.ib_devices.begin(), dev.ib_devices.end());
  }
  if (!hcas.empty()) {
    std::string list;
    for (const std::string& hca : hcas) list += (list.empty() ? "" : ",") + hca;
    propose(request, &config, "NCCL_IB_HCA", "=" + list, "InfiniBand devices, exact names");
  }

  TopoXmlOptions xml_options;
  xml_options.cpu = request.cpu;
  xml_options.first_rank = config.node_rank * gpus;
  xml_options.gpudirect_known = request.gpudirect_known;
  config.files.emplace_back("nccl-topo.xml",
                            nccl_topo_xml(config.topo, request.details, xml_options));
  config.files.emplace_back("nccl-graph.xml", nccl_graph_xml(config.graph));
  config.files.emplace_back("nccl.env", env_file(config));
  if (!config.hosts.empty()) config.files.emplace_back("hosts", hosts_lines(config.hosts));
  if (!request.tuning_table.empty()) {
    config.files.emplace_back("nccl-tuning.json", request.tuning_table);
  }
  return config;
}

void write_nccl_files(const NcclConfig& config) {
  int rc = make_directories(config.out_dir);
  if (rc < 0) throw SysError(-rc, "mkdir", config.out_dir);
  std::vector<std::pair<std::string, std::string>> files;
  for (const auto& [name, content] : config.files) {
    files.emplace_back(config.out_dir + "/" + name, content);
  }
  std::string failed;
  rc = write_files_atomically(files, &failed);
  if (rc < 0) throw SysError(-rc, "write", failed);
}

std::string nccl_summary(const NcclConfig& config) {
  std::string out;
  char line[256];
  const RingPlan& ring = config.ring;
  const Matrix& matrix = config.topo.matrix;
  std::snprintf(line, sizeof line,
                "ring: %zu GPUs, %s, slowest hop %.1f GB/s, SYS %d, NODE %d, PHB %d\n",
                ring.order.size(), ring.exact ? "exact" : "heuristic (2-opt)",
                ring.cost.bottleneck_gbs, ring.cost.sys, ring.cost.node, ring.cost.phb);
  out += line;
  out += "  ";
  for (size_t i = 0; i < ring.order.size(); ++i) {
    int from = ring.order[i];
    int to = ring.order[(i + 1) % ring.order.size()];
    out +=
        matrix.labels[static_cast<size_t>(from)] + " -" + hop_name(config.hops[from][to]) + "-> ";
  }
  out += ring.order.empty() ? "\n" : matrix.labels[static_cast<size_t>(ring.order.front())] + "\n";
  if (!config.nvml) out += "  (no NVML data: hops are PCIe as sysfs shows them; NVLinks unknown)\n";
  for (const RailCut& rail : config.rails) {
    out += "  rail " + config.nets[static_cast<size_t>(rail.nic)] + ": enters at " +
           matrix.labels[static_cast<size_t>(rail.order.front())] + ", leaves from " +
           matrix.labels[static_cast<size_t>(rail.order.back())] + " (" + level_name(rail.worst) +
           " to the NIC)\n";
  }
  size_t channels = config.graph.channels.size();
  std::snprintf(line, sizeof line, "graph: %zu channel%s of %.2f GB/s, intra %s, inter %s\n",
                channels, channels == 1 ? "" : "s", config.graph.speed_intra_gbs,
                config.graph.type_intra.c_str(), config.graph.type_inter.c_str());
  out += line;
  bool forced = std::any_of(config.env.begin(), config.env.end(),
                            [](const EnvSetting& s) { return s.key == "NCCL_GRAPH_FILE"; });
  if (!forced) out += "  (written for inspection; --force-rings makes NCCL use it)\n";
  out += "env:\n";
  for (const EnvSetting& setting : config.env) {
    out += "  " + setting.key + "=" + setting.value;
    if (setting.from_environment) {
      out += setting.value == setting.proposed
                 ? "  (also set in the environment)"
                 : "  (kept from the environment; pod-init chose " + setting.proposed + ")";
    } else {
      out += "  (" + setting.reason + ")";
    }
    out += "\n";
  }
  if (!config.hosts.empty()) {
    out += "hosts: " + std::to_string(config.hosts.size()) + " nodes, this is node-" +
           std::to_string(config.node_rank) + ", master node-0 " + config.hosts.front().address +
           "\n";
  }
  out += "wrote:";
  for (const auto& [name, content] : config.files) out += " " + name;
  out += " in " + config.out_dir + "\n";
  return out;
}

}  // namespace pod_init
