// Enumeration of PCI functions from a sysfs tree (`<root>/bus/pci/devices`).
// Every path is taken relative to a sysfs root so tests run on fixture trees.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "topology/bar.hpp"
#include "topology/config_space.hpp"
#include "topology/findings.hpp"

namespace pod_init {

enum class DeviceKind { Gpu, Nic, Nvme, Bridge, Other };
const char* device_kind_name(DeviceKind kind);

struct LinkInfo {
  std::optional<double> speed_gts;
  std::optional<double> max_speed_gts;
  std::optional<int> width;
  std::optional<int> max_width;
  bool from_config = false;  // sysfs had no link attributes; config space did
};

struct PciDevice {
  std::string bdf;
  std::string path;                   // resolved device directory
  std::string root_bus;               // "pci0000:00": the host bridge the device hangs below
  std::vector<std::string> upstream;  // bridges from the root port down to the parent
  uint16_t vendor = 0;
  uint16_t device = 0;
  uint32_t class_code = 0;
  DeviceKind kind = DeviceKind::Other;
  std::string driver;
  int numa_node = -1;
  std::string local_cpulist;
  int iommu_group = -1;
  LinkInfo link;
  std::vector<Bar> bars;
  bool bars_known = false;  // `resource` was read and parsed
  ConfigInfo config;
  bool config_readable = false;
  std::vector<std::string> net_interfaces;
  std::vector<std::string> ib_devices;
  std::vector<std::string> nvme_controllers;
  std::vector<std::string> block_devices;
  std::optional<Bar0Probe> bar0;  // GPUs only, when BAR probing is on
};

struct PciScanOptions {
  std::string sysfs_root = "/sys";
  bool probe_bar0 = true;
};

// Fills `devices` (sorted by BDF) and appends SYSFS_* / BAR0 findings for what
// could not be read. Returns -errno only when `<root>/bus/pci/devices` itself
// cannot be listed.
int scan_pci_devices(const PciScanOptions& options, std::vector<PciDevice>* devices,
                     std::vector<Finding>* findings);

// Number of NUMA nodes under `<root>/devices/system/node`, 0 when unknown.
int count_numa_nodes(const std::string& sysfs_root);

}  // namespace pod_init
