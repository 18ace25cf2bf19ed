// What PID 1 leaves for the command it starts, so that nothing is done twice:
// one folder (default /run/pod-init) holding the topology it scanned, the NCCL
// files it built, and node.json, the manifest written last, naming the boot
// (/proc/sys/kernel/random/boot_id) they describe and the boot's timeline.
// `pyinit run` reuses them when the boot id is this boot's.
//
//   DIR/topology.json   what `pod-init topo --json` prints (findings included)
//   DIR/nccl/           nccl-topo.xml, nccl-graph.xml, nccl.env (GPU nodes only)
//   DIR/node.json       {"boot_id", "sysfs_root", "topology", "nccl": {"dir", "env"} | null,
//                        "timeline": [{"phase", "start_s", "seconds"}]}
#pragma once

#include <string>
#include <vector>

#include "nccl/nccl_config.hpp"
#include "topology/topology.hpp"

namespace pod_init {

inline constexpr const char* kBootStateDir = "/run/pod-init";

// One step of the boot: its start on CLOCK_BOOTTIME (seconds since the kernel
// started) and how long it took.
struct BootPhase {
  std::string phase;
  double start_s = 0;
  double seconds = 0;
};

// The phase between two CLOCK_BOOTTIME readings in nanoseconds.
inline BootPhase boot_phase(std::string name, uint64_t start_ns, uint64_t end_ns) {
  return {std::move(name), static_cast<double>(start_ns) / 1e9,
          static_cast<double>(end_ns - start_ns) / 1e9};
}

// This boot's id, "" when the kernel does not say.
std::string read_boot_id(const std::string& proc_root = "/proc");

// Writes the folder: topology.json, the NCCL files when `nccl` is given, then
// node.json last, each whole or not at all. Throws SysError naming the file.
void write_boot_state(const std::string& dir, const std::string& boot_id, const Topology& topo,
                      const NcclConfig* nccl, const std::vector<BootPhase>& timeline);

}  // namespace pod_init
