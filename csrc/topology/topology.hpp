// The node's PCIe picture: pair levels between GPUs, NICs and NVMe drives in the
// meaning of `nvidia-smi topo -m` and NVML's common-ancestor levels, and scan(),
// the API entry point that the executable and the Python binding share.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "topology/findings.hpp"
#include "topology/pci_scan.hpp"

namespace pod_init {

// Values are NVML's nvmlGpuTopologyLevel_t, so they compare directly with
// nvmlDeviceGetTopologyCommonAncestor.
enum class Level {
  Self = 0,   // X
  Pix = 10,   // at most one PCIe switch
  Pxb = 20,   // several switches, no host bridge
  Phb = 30,   // through a host bridge
  Node = 40,  // between host bridges of one NUMA node
  Sys = 50,   // across NUMA nodes
};
const char* level_name(Level level);

using DeviceIndex = std::unordered_map<std::string, const PciDevice*>;
DeviceIndex index_by_bdf(const std::vector<PciDevice>& devices);

// Without config space, a bridge's role from its place in a chain: the first
// below a host bridge is a root port, then upstream/downstream pairs follow,
// one pair per switch.
PortType port_type_by_position(size_t position);

// The switch a bridge belongs to, named by the switch's upstream port; "" for
// a root port. From the config-space port type where it was readable, else by
// position in the chain: root port first, then upstream/downstream pairs.
std::string switch_of(const std::vector<std::string>& chain, size_t position,
                      const DeviceIndex& index);

// Bridges on the path between a and b (both sides below the deepest common
// bridge, plus that bridge); every bridge of both chains when they share none.
std::vector<std::string> bridges_between(const PciDevice& a, const PciDevice& b);

Level classify(const PciDevice& a, const PciDevice& b, const DeviceIndex& index);

// What a device's link carries when busy: the top speed both ends support (an
// idle GPU trains its speed down, so the current speed says little) at the
// trained width (a degraded width is real). Zeros where sysfs did not say.
struct LinkCapability {
  double speed_gts = 0;
  int width = 0;
};
LinkCapability link_capability(const PciDevice& dev, const DeviceIndex& index);

struct Matrix {
  std::vector<size_t> members;      // indices into Topology::devices: GPUs, NICs, NVMe
  std::vector<std::string> labels;  // GPU0.., NIC0.., NVME0..
  std::vector<std::vector<Level>> rows;
  // NVLinks between members (NV# in `nvidia-smi topo -m`); empty when NVML did not say.
  std::vector<std::vector<int>> nvlinks;
};

// "NV18" where NVLinks join the pair, else the PCIe level's name.
std::string matrix_cell(const Matrix& matrix, size_t row, size_t column);

struct Topology {
  std::string sysfs_root;
  std::vector<PciDevice> devices;
  Matrix matrix;
  std::vector<Finding> findings;
  int numa_nodes = 0;
  double scan_seconds = 0;
};

// The most GPUs a node may be expected to hold (--expect-gpus): far past any machine.
inline constexpr int kMaxExpectedGpus = 4096;

struct ScanOptions {
  std::string sysfs_root = "/sys";
  int expect_gpus = -1;  // < 0: no expectation; at most kMaxExpectedGpus
  bool probe_bar0 = true;
};

// Throws SysError when the sysfs tree has no readable bus/pci/devices; every
// other problem becomes a finding.
Topology scan(const ScanOptions& options);

Matrix build_matrix(const std::vector<PciDevice>& devices);

// Replaces the GPU-count finding with one for `expect_gpus` (< 0: none), for a
// scan reused under another expectation than the one it was made with.
void expect_gpus(Topology* topo, int expect_gpus);

}  // namespace pod_init
