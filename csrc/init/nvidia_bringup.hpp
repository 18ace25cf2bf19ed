// The NVIDIA driver brought up as PID 1 does it, in the order a node needs
// before CUDA: the modules with their parameters, the GPUs bound by the
// driver, the device nodes, persistence, and on NVSwitch boards the fabric
// manager and the fabric's completion; at the end, module loading locked.
// Each step is a boot phase. NVML is read through pod-init-nvml (nvml_state).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "init/boot_state.hpp"
#include "topology/nvlink.hpp"
#include "topology/topology.hpp"

namespace pod_init {

// The NVIDIA functions a scan found: GPUs, and NVSwitches (class 0x0680).
struct NvidiaHardware {
  std::vector<std::string> gpus;
  std::vector<std::string> nvswitches;
};
NvidiaHardware find_nvidia_hardware(const Topology& topo);

// Whether `release_dir`'s modules.dep names the nvidia module (the image was
// built with initramfs/build --nvidia-driver).
bool holds_nvidia_driver(const std::string& release_dir);

struct NvidiaBringupOptions {
  std::string release_dir;  // /lib/modules/RELEASE
  std::string nvreg;        // the nvidia module's parameters ("NVreg_A=1 NVreg_B=2")
  unsigned deadline_s = 120;
  // Change nothing: modules, nodes, daemons and NVML settings are seen, never made.
  bool dry_run = false;
  std::string proc_dir = "/proc";
  std::string dev_dir = "/dev";
  std::string sys_module_dir = "/sys/module";
  std::string helper = "/sbin/pod-init-nvml";
  std::string persistenced = "/usr/bin/nvidia-persistenced";
  std::string fabric_manager = "/usr/bin/nv-fabricmanager";
  std::string fabric_config = "/usr/share/nvidia/nvswitch/fabricmanager.cfg";
  // For programs of the boot image: its library folders (they have no ld.so.cache).
  std::string library_path;
  // Programs started in a mount namespace of their own keep the boot image's
  // view when PID 1 later switches root.
  bool private_mounts = true;
  std::function<void(const std::string&)> log;
};

class NvidiaBringup {
 public:
  explicit NvidiaBringup(NvidiaBringupOptions options);
  NvidiaBringup(const NvidiaBringup&) = delete;
  NvidiaBringup& operator=(const NvidiaBringup&) = delete;
  ~NvidiaBringup();

  // The steps that need the boot image's files: modules, the GPUs' wait,
  // device nodes, persistence, the fabric manager and NVML's watch started.
  // Throws std::runtime_error with one line when the boot must stop.
  void start(const NvidiaHardware& hardware);
  // NVML's answer, waited for: every GPU's details (sm, NVLinks) for the NCCL
  // files, once the fabric is complete. Throws as start() does.
  GpuDetailsMap finish();
  // No module loads after this (/proc/sys/kernel/modules_disabled); its phase.
  BootPhase lock_modules();
  const std::vector<BootPhase>& phases() const { return phases_; }

 private:
  void load_modules_step();
  void wait_for_gpus();
  void make_nodes();
  void start_persistence();
  void start_fabric_manager();
  void start_watch();
  pid_t spawn(const std::vector<std::string>& argv, int* output);
  // Waits for `pid` up to the deadline; its exit status, or -1 past it.
  int wait_exit(pid_t pid, uint64_t deadline_ms);
  void log(const std::string& line) const;

  NvidiaBringupOptions options_;
  NvidiaHardware hardware_;
  std::vector<int> held_;  // device files kept open: the GPUs stay initialised
  bool persistence_by_nvml_ = false;
  pid_t watch_ = -1;
  int watch_output_ = -1;
  uint64_t driver_load_started_ns_ = 0;  // 0 when the driver was loaded before us
  uint64_t watch_started_ns_ = 0;
  uint64_t fabric_started_ns_ = 0;
  std::vector<BootPhase> phases_;
};

}  // namespace pod_init
