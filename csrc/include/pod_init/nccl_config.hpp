// `pod-init nccl`: the node's NCCL configuration from its topology, written as
// files NCCL reads (topology XML, ring graph XML, env file, hosts lines).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "pod_init/hostfile.hpp"
#include "pod_init/nccl_xml.hpp"
#include "pod_init/nvlink.hpp"
#include "pod_init/rings.hpp"
#include "pod_init/topology.hpp"

namespace pod_init {

struct NcclRequest {
  std::string sysfs_root = "/sys";
  std::string proc_root = "/proc";  // for cpuinfo
  std::string hints_path;           // "" none
  std::string hostfile_path;        // "" single node
  std::string hostfile_text;  // read from hostfile_path when empty (the path still names errors)
  std::string out_dir = ".";
  std::string socket_ifname;  // "" the interface that reaches the master
  bool force_rings = false;   // point NCCL_GRAPH_FILE at the rings
  int channels = 0;           // ring channels in the graph; 0 from the ring's bandwidth
  GpuDetailsMap details;      // NVML's view, when there is one
  std::map<std::string, std::string> environment;  // NCCL_* already set: they win
  std::string sys_class_net = "/sys/class/net";    // live interfaces, whatever sysfs_root is
};

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

// Throws InputError for bad input (hints, hostfile, interface, no GPU) and
// SysError when sysfs itself cannot be read. Writes nothing.
NcclConfig build_nccl_config(const NcclRequest& request);

// Writes every file under config.out_dir, each whole or not at all.
void write_nccl_files(const NcclConfig& config);

// What `pod-init nccl` prints: files, the ring with per-hop links, channels, env, hosts.
std::string nccl_summary(const NcclConfig& config);

}  // namespace pod_init
