// `pod-init nccl`: the node's NCCL configuration from its topology, written as
// files NCCL reads (topology XML, ring graph XML, env file, hosts lines).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nccl/hostfile.hpp"
#include "nccl/nccl_plan.hpp"
#include "topology/nvlink.hpp"
#include "topology/topology.hpp"

namespace pod_init {

// What the builder works from, as values: the caller scans (or loads a scan)
// once and reads its files once; the builder reads nothing but the live
// network interfaces it must choose among.
struct NcclRequest {
  Topology topo;                   // scanned (or loaded from PID 1's topology.json)
  std::optional<TopoHints> hints;  // regrouping of a flattened VM
  std::string hints_source;        // the hints file, naming errors
  NodeList nodes;                  // no hosts: a single node
  CpuIdentity cpu;                 // from /proc/cpuinfo
  bool gpudirect_known = false;    // nvidia-peermem is loaded
  std::string out_dir = ".";
  std::string socket_ifname;  // "" the interface that reaches the master
  bool force_rings = false;   // point NCCL_GRAPH_FILE at the rings
  int channels = 0;           // ring channels in the graph; 0 from the ring's bandwidth
  GpuDetailsMap details;      // NVML's view, when there is one
  std::map<std::string, std::string> environment;  // NCCL_* already set: they win
  std::string sys_class_net = "/sys/class/net";    // live interfaces, whatever the topology's root
  // `pyinit nccl --tune`'s whole-run settings for this kind of node, and its
  // table (JSON, for the tuner plugin), written beside the other files.
  std::map<std::string, std::string> tuned_env;
  std::string tuning_table;
};

// What a caller names for a request: files to read and the environment.
struct NcclSources {
  std::string hints;                               // the hints file; "" none
  std::string proc_root = "/proc";                 // whose cpuinfo names the CPU
  std::map<std::string, std::string> environment;  // the whole environment: its NCCL_* win
};

// The one place a request is made (pod-init nccl, PID 1, pyinit): the
// topology as scanned, and each source read once: the hints file (SysError
// when unreadable, InputError naming the line when malformed), the CPU
// identity from PROC_ROOT/cpuinfo, whether nvidia-peermem is loaded under the
// topology's sysfs root, and the environment's NCCL_* settings. The caller
// adds the values it has (nodes, out_dir, options, NVML's details).
NcclRequest make_nccl_request(Topology topo, const NcclSources& sources);

// The environment of this process as a map (for NcclSources::environment).
std::map<std::string, std::string> process_environment();

struct EnvSetting {
  std::string key;
  std::string value;     // what the env file says: the environment's value when set there
  std::string proposed;  // what pod-init chose
  std::string reason;
  bool from_environment = false;
};

struct NcclConfig {
  std::string out_dir;  // absolute
  Topology topo;
  bool hinted = false;
  bool nvml = false;  // NVLink details were merged
  HopMatrix hops;
  RingPlan ring;
  std::vector<std::string> nets;  // NIC names in `net dev` order
  std::vector<RailCut> rails;     // multi-node only
  RingGraph graph;
  std::vector<HostEntry> hosts;
  int node_rank = 0;
  std::vector<EnvSetting> env;
  std::vector<std::pair<std::string, std::string>> files;  // name in out_dir, content
};

inline constexpr int kMaxChannels = 32;

// Throws InputError for bad input (hints that do not fit, interface, no GPU).
// Reads and writes nothing.
NcclConfig build_nccl_config(const NcclRequest& request);

// Writes every file under config.out_dir, each whole or not at all.
void write_nccl_files(const NcclConfig& config);

// What `pod-init nccl` prints: files, the ring with per-hop links, channels, env, hosts.
std::string nccl_summary(const NcclConfig& config);

}  // namespace pod_init
