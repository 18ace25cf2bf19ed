#include "init/machine_init.hpp"

#include <fcntl.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.hpp"
#include "common/error.hpp"
#include "common/line_input.hpp"
#include "common/sysfs.hpp"
#include "init/boot_state.hpp"
#include "init/kernel_modules.hpp"
#include "init/nvidia_bringup.hpp"
#include "init/supervisor.hpp"
#include "nccl/nccl_config.hpp"
#include "topology/topology.hpp"

namespace pod_init {

namespace {

constexpr ino_t kInitPidNamespaceInode = 0xEFFFFFFCU;  // PROC_PID_INIT_INO
constexpr const char* kConfigFile = "/etc/pod-init.conf";
constexpr const char* kDefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
constexpr unsigned kDeviceWaitMs = 30000;
// Where the boot image's shared libraries are (it has no ld.so.cache): the
// driver's daemons and pod-init-nvml run with these.
constexpr const char* kImageLibraryPath =
    "/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu:/lib64:/usr/lib64:/lib:/usr/lib";

struct PseudoMount {
  const char* source;
  const char* target;
  const char* type;
  unsigned long flags;
  const char* data;
};

// In order: each target lives in a filesystem mounted before it.
constexpr PseudoMount kPseudoMounts[] = {
    {"proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr},
    {"sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr},
    {"devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755"},
    {"devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "gid=5,mode=620,ptmxmode=666"},
    // NCCL and DataLoader workers share memory through /dev/shm.
    {"tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777"},
    {"tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755"},
    {"cgroup2", "/sys/fs/cgroup", "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr},
};

int mount_one(const PseudoMount& m) {
  if (mkdir(m.target, 0755) != 0 && errno != EEXIST) return -errno;
  if (mount(m.source, m.target, m.type, m.flags, m.data) != 0 && errno != EBUSY) return -errno;
  return 0;
}

void mount_pseudo_filesystems() {
  for (const PseudoMount& m : kPseudoMounts) {
    if (int rc = mount_one(m); rc < 0) {
      boot_log(std::string("cannot mount ") + m.type + " on " + m.target + ": " + errno_text(-rc));
    }
  }
}

void attach_console() {
  int fd = open("/dev/console", O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return;  // the kernel's console, if any, stays
  for (int target = 0; target < 3; ++target) dup2(fd, target);
  close(fd);
}

// Drivers probe in the background after finit_module returns (NVMe namespaces
// appear once the controller has reset), as rootwait knows: poll for the path.
void wait_for_path(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) == 0) return;
  const uint64_t start = monotonic_ms();
  while (stat(path.c_str(), &st) != 0) {
    if (monotonic_ms() - start > kDeviceWaitMs) {
      throw SysError(ENOENT, "wait " + std::to_string(kDeviceWaitMs / 1000) + " s for", path);
    }
    usleep(5000);
  }
  boot_log("wait: " + path + " appeared after " + std::to_string(monotonic_ms() - start) + " ms");
}

// Mounts `device` at `target`, trying each block filesystem the kernel knows.
int mount_device(const std::string& device, const std::string& target, std::string* type) {
  std::string filesystems;
  int rc = sysfs::read_text("/proc/filesystems", &filesystems);
  if (rc < 0) return rc;
  if (mkdir(target.c_str(), 0755) != 0 && errno != EEXIST) return -errno;
  int last = -ENODEV;
  bool found = false;
  for_each_fields_line(filesystems, [&](int, const std::vector<std::string>& fields) {
    if (found || fields.size() != 1) return 0;  // "nodev NAME" lines need no device
    if (mount(device.c_str(), target.c_str(), fields[0].c_str(), 0, nullptr) == 0) {
      *type = fields[0];
      found = true;
    } else if (errno != EINVAL) {
      last = -errno;  // EINVAL: not this filesystem; anything else says more
    }
    return 0;
  });
  return found ? 0 : last;
}

// podinit.data=DEVICE[:MOUNTPOINT]; the device is there (see devices_to_wait_for).
void mount_data(const std::string& spec) {
  size_t colon = spec.find(':');
  std::string device = spec.substr(0, colon);
  std::string target = colon == std::string::npos ? "/data" : spec.substr(colon + 1);
  std::string type;
  int rc = mount_device(device, target, &type);
  if (rc < 0) throw SysError(-rc, "mount (podinit.data) at " + target, device);
  boot_log("data: " + device + " mounted at " + target + " (" + type + ")");
}

// The device paths the command's mounts and podinit.wait name, waited for in one
// phase before the root is mounted (drivers probe them in the background).
std::vector<std::string> devices_to_wait_for(const InitConfig& config, bool root_too) {
  std::vector<std::string> paths;
  if (root_too && config.root.rfind("/dev/", 0) == 0) paths.push_back(config.root);
  if (!config.data.empty()) paths.push_back(config.data.substr(0, config.data.find(':')));
  paths.insert(paths.end(), config.wait.begin(), config.wait.end());
  return paths;
}

// podinit.warm: `pyinit warm start --no-wait` (from PATH, in the root) as a
// child that ends once the warm interpreter's socket is bound; its imports go
// on beside the boot's remaining steps. -1 when it could not be started.
pid_t start_warm_interpreter(const InitConfig& config) {
  std::vector<std::string> words = {"pyinit", "warm", "start", "--no-wait"};
  if (!config.warm_preloads.empty()) {
    words.emplace_back("--preload");
    words.push_back(config.warm_preloads);
  }
  std::vector<char*> argv;
  for (std::string& word : words) argv.push_back(word.data());
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    execvp(argv[0], argv.data());
    _exit(errno == ENOENT ? 127 : 126);
  }
  if (pid < 0) boot_log(std::string("warm: fork: ") + errno_text(errno));
  return pid;
}

// Waits for that child; says how it ended when it did not succeed.
void wait_warm_interpreter(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      boot_log(std::string("warm: waitpid: ") + errno_text(errno));
      return;
    }
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    boot_log("warm: pyinit warm start exited with status " + std::to_string(code) +
             " (the command starts cold)");
  } else {
    boot_log("warm: the warm interpreter's socket is bound");
  }
}

// The loopback interface up, as every init does: a single node's ranks meet
// at 127.0.0.1 (torch's store, gloo), and the kernel starts with lo down.
void bring_up_loopback() {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    boot_log(std::string("network: no socket for lo: ") + errno_text(errno));
    return;
  }
  ifreq request{};
  std::snprintf(request.ifr_name, sizeof request.ifr_name, "lo");
  if (ioctl(fd, SIOCGIFFLAGS, &request) == 0) {
    request.ifr_flags = static_cast<short>(request.ifr_flags | IFF_UP | IFF_RUNNING);
    if (ioctl(fd, SIOCSIFFLAGS, &request) == 0) {
      boot_log("network: lo up");
    } else {
      boot_log(std::string("network: cannot bring lo up: ") + errno_text(errno));
    }
  }
  close(fd);
}

// podinit.root=DEVICE|DIR: what switch_root does. The pseudo filesystems move
// along; the boot image's files stay in memory (a static binary is small).
void switch_root(const std::string& spec) {
  std::string root = spec;
  if (spec.rfind("/dev/", 0) == 0) {
    root = "/newroot";
    std::string type;
    int rc = mount_device(spec, root, &type);
    if (rc < 0) throw SysError(-rc, "mount (podinit.root)", spec);
  } else if (mount(root.c_str(), root.c_str(), nullptr, MS_BIND, nullptr) != 0) {
    throw SysError(errno, "bind mount (podinit.root)",
                   root);  // a bind, so it is a mount point to move
  }
  for (const char* pseudo : {"/dev", "/proc", "/sys", "/run"}) {
    std::string target = root + pseudo;
    if (mkdir(target.c_str(), 0755) != 0 && errno != EEXIST) throw SysError(errno, "mkdir", target);
    if (mount(pseudo, target.c_str(), nullptr, MS_MOVE, nullptr) != 0) {
      throw SysError(errno, std::string("move ") + pseudo + " to", target);
    }
  }
  if (chdir(root.c_str()) != 0) throw SysError(errno, "chdir", root);
  if (mount(root.c_str(), "/", nullptr, MS_MOVE, nullptr) != 0)
    throw SysError(errno, "move to /", root);
  if (chroot(".") != 0 || chdir("/") != 0) throw SysError(errno, "chroot", root);
  boot_log("root: switched to " + spec);
}

InitConfig read_config(std::vector<std::string>* errors) {
  InitConfig config;
  std::string text;
  if (read_input_file(kConfigFile, &text, 1 << 20) == 0) {
    apply_init_file(text, kConfigFile, &config, errors);
  }
  if (int rc = sysfs::read_text("/proc/cmdline", &text, 1 << 20); rc < 0) {
    errors->push_back("/proc/cmdline: " + errno_text(-rc));
  } else {
    apply_init_params(split_cmdline(text), "kernel command line", &config, errors);
  }
  if (config.command.empty()) {
    errors->push_back("no command: give podinit.cmd= or words after -- on the kernel command line");
  }
  return config;
}

NvidiaBringupOptions nvidia_options(const InitConfig& config) {
  NvidiaBringupOptions options;
  options.release_dir = running_release_dir();
  options.nvreg = config.nvreg;
  options.deadline_s = config.gpu_wait_s;
  options.library_path = kImageLibraryPath;
  options.log = boot_log;
  return options;
}

void load_configured_modules(const InitConfig& config) {
  if (config.modules.empty()) return;
  const std::string release_dir = running_release_dir();
  std::vector<ModuleLoad> loads;
  std::string missing;
  int rc = load_modules(release_dir, config.modules, &loads, &missing);
  uint64_t total_ns = 0;
  for (const ModuleLoad& load : loads) {
    total_ns += load.nanoseconds;
    boot_log(module_load_line(load));
  }
  if (rc == -ENOENT && !missing.empty() && (loads.empty() || loads.back().result == 0)) {
    throw SysError(ENOENT, "find module " + missing + " in", release_dir + "/modules.dep");
  }
  if (rc < 0) throw SysError(-rc, "load module " + loads.back().name);
  char line[80];
  std::snprintf(line, sizeof line, "modules: %zu loaded in %.1f ms", loads.size(),
                static_cast<double>(total_ns) / 1e6);
  boot_log(line);
}

// Records each boot step's start and length for node.json's timeline.
class BootTimeline {
 public:
  template <typename Step>
  auto measure(const char* phase, Step step) {
    const uint64_t start = boottime_ns();
    struct Record {
      BootTimeline* timeline;
      const char* phase;
      uint64_t start;
      ~Record() { timeline->add(phase, start, boottime_ns()); }
    } record{this, phase, start};
    return step();
  }
  void add(BootPhase phase) { phases_.push_back(std::move(phase)); }
  void add(const char* phase, uint64_t start_ns, uint64_t end_ns) {
    phases_.push_back(boot_phase(phase, start_ns, end_ns));
  }
  const std::vector<BootPhase>& phases() const { return phases_; }

 private:
  std::vector<BootPhase> phases_;
};

// The scan's summary and its findings on the console; throws when one is an error.
void log_preflight(const Topology& topo) {
  int counts[5] = {};
  for (const PciDevice& device : topo.devices) ++counts[static_cast<int>(device.kind)];
  std::string line = "scan: " + std::to_string(topo.devices.size()) + " PCI devices";
  for (DeviceKind kind : {DeviceKind::Gpu, DeviceKind::Nic, DeviceKind::Nvme}) {
    line += std::string(", ") + device_kind_name(kind) + " " +
            std::to_string(counts[static_cast<int>(kind)]);
    for (const PciDevice& device : topo.devices) {
      if (device.kind == kind) line += " " + device.bdf;
    }
  }
  boot_log(line);
  for (const Finding& finding : topo.findings) {
    if (finding.severity == Severity::Info) continue;
    boot_log(std::string("preflight ") + severity_name(finding.severity) + " " + finding.code +
             (finding.device.empty() ? "" : " " + finding.device) + ": " + finding.message);
  }
}

int gpu_count(const Topology& topo) {
  int gpus = 0;
  for (const PciDevice& device : topo.devices) gpus += device.kind == DeviceKind::Gpu;
  return gpus;
}

// The NVIDIA device nodes (unless the driver's bring-up made them), then the
// NCCL configuration from the scan in hand and what NVML said of the GPUs.
NcclConfig configure_gpus(const Topology& topo, const GpuDetailsMap& details, bool make_nodes) {
  std::string devices;
  if (make_nodes && sysfs::read_text("/proc/devices", &devices) == 0) {
    std::vector<DeviceNode> nodes = nvidia_device_nodes(devices, gpu_count(topo));
    if (!nodes.empty()) {
      int rc = make_device_nodes(nodes);
      if (rc < 0) throw SysError(-rc, "mknod (NVIDIA device nodes)");
      boot_log("nvidia: " + std::to_string(nodes.size()) + " device nodes made");
    }
  }
  NcclRequest request = make_nccl_request(topo, {"", "/proc", process_environment()});
  request.out_dir = std::string(kBootStateDir) + "/nccl";
  request.details = details;
  return build_nccl_config(request);
}

// Disk filesystems unmounted (or, when busy, remounted read-only), the last
// mounted first, so their journals are closed before the power goes: what
// sync alone does not promise. Each one is logged, so a hang shows where.
void release_filesystems() {
  std::string mounts;
  if (sysfs::read_text("/proc/mounts", &mounts, 1 << 20) < 0) return;
  std::vector<std::string> targets;
  for_each_fields_line(mounts, [&](int, const std::vector<std::string>& fields) {
    if (fields.size() >= 2 && fields[0].rfind("/dev/", 0) == 0) targets.push_back(fields[1]);
    return 0;
  });
  for (auto target = targets.rbegin(); target != targets.rend(); ++target) {
    if (*target != "/" && umount2(target->c_str(), 0) == 0) {
      boot_log("unmounted " + *target);
    } else if (mount(nullptr, target->c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr) == 0) {
      boot_log("remounted " + *target + " read-only");
    } else {
      boot_log("cannot release " + *target + ": " + errno_text(errno));
    }
  }
}

}  // namespace

bool is_machine_init() {
  if (getpid() != 1) return false;
  struct stat st {};
  if (stat("/proc/self/ns/pid", &st) != 0) {
    // No /proc yet: the kernel has just started us, or a container left it out.
    if (mount_one(kPseudoMounts[0]) < 0 || stat("/proc/self/ns/pid", &st) != 0) return false;
  }
  return st.st_ino == kInitPidNamespaceInode;
}

void boot_log(const std::string& message) {
  uint64_t ns = boottime_ns();
  std::printf("[%5llu.%06llu] pod-init: %s\n", static_cast<unsigned long long>(ns / 1000000000u),
              static_cast<unsigned long long>(ns % 1000000000u / 1000u), message.c_str());
  std::fflush(stdout);
}

void end_machine(EndAction action) {
  boot_log(std::string("ending: ") + end_action_name(action));
  sync();
  release_filesystems();
  int how = action == EndAction::Reboot ? RB_AUTOBOOT
            : action == EndAction::Halt ? RB_HALT_SYSTEM
                                        : RB_POWER_OFF;
  reboot(how);
  // Still here: nothing can be done that is better than waiting; never exit.
  boot_log(std::string("reboot() failed: ") + errno_text(errno));
  for (;;) pause();
}

void run_machine_init() {
  const uint64_t started_ns = boottime_ns();
  // Ctrl-Alt-Del becomes SIGINT to us (forwarded to the command) instead of an instant reboot.
  reboot(RB_DISABLE_CAD);
  mount_pseudo_filesystems();
  attach_console();
  boot_log("started as the machine's init");
  bring_up_loopback();
  std::vector<std::string> errors;
  InitConfig config = read_config(&errors);
  for (const std::string& error : errors) boot_log("configuration: " + error);
  if (!errors.empty()) end_machine(config.end);
  int status = 0;
  try {
    if (!config.hostname.empty()) {
      if (sethostname(config.hostname.c_str(), config.hostname.size()) != 0) {
        throw SysError(errno, "sethostname " + config.hostname);
      }
      boot_log("hostname: " + config.hostname);
    }
    BootTimeline timeline;
    timeline.add("kernel", 0, started_ns);
    timeline.measure("modules", [&] { load_configured_modules(config); });
    if (getenv("PATH") == nullptr) setenv("PATH", kDefaultPath, 1);
    std::optional<Topology> topo;
    auto scan_node = [&] {
      topo = timeline.measure("scan", [&] {
        ScanOptions options;
        options.sysfs_root = config.sysfs_root;
        options.expect_gpus = config.expect_gpus;
        return scan(options);
      });
      log_preflight(*topo);
      if (has_errors(topo->findings)) {
        throw std::runtime_error("preflight found errors: not starting the command");
      }
    };
    // An image with the NVIDIA driver starts it from the boot image's files
    // before anything else: the scan first, to know the GPUs to wait for.
    // Its daemons and NVML's watch then run beside the root, the warm
    // interpreter and the mounts, and the NCCL files wait for the fabric.
    std::unique_ptr<NvidiaBringup> nvidia;
    if (holds_nvidia_driver(running_release_dir())) {
      scan_node();
      NvidiaHardware hardware = find_nvidia_hardware(*topo);
      if (hardware.gpus.empty() && hardware.nvswitches.empty()) {
        boot_log("nvidia: no NVIDIA GPU or NVSwitch here: the driver is not started");
      } else {
        nvidia = std::make_unique<NvidiaBringup>(nvidia_options(config));
        nvidia->start(hardware);
      }
    }
    // With podinit.warm the root (where Python is) comes first, so that the warm
    // interpreter starts and imports beside the scan, the device waits and the mounts.
    const bool root_first = config.warm && !config.root.empty();
    if (root_first) {
      timeline.measure("root wait", [&] {
        if (config.root.rfind("/dev/", 0) == 0) wait_for_path(config.root);
      });
      timeline.measure("root", [&] { switch_root(config.root); });
    }
    pid_t warm = -1;
    const uint64_t warm_started = boottime_ns();
    if (config.warm) warm = start_warm_interpreter(config);
    if (!topo) scan_node();
    timeline.measure("device wait", [&] {
      for (const std::string& path : devices_to_wait_for(config, !root_first)) {
        wait_for_path(path);
      }
    });
    // The root first: the data mount belongs in the root the command sees.
    if (!config.root.empty() && !root_first) {
      timeline.measure("root", [&] { switch_root(config.root); });
    }
    if (!config.data.empty()) timeline.measure("data", [&] { mount_data(config.data); });
    GpuDetailsMap details;
    if (nvidia) {
      details = nvidia->finish();
      for (const BootPhase& phase : nvidia->phases()) timeline.add(phase);
    }
    std::optional<NcclConfig> nccl;
    if (gpu_count(*topo) > 0) {
      nccl = timeline.measure("nccl", [&] { return configure_gpus(*topo, details, !nvidia); });
    }
    std::vector<std::pair<std::string, std::string>> env;
    if (nccl) {
      for (const EnvSetting& setting : nccl->env) env.emplace_back(setting.key, setting.value);
    }
    if (warm > 0) {
      // Bound before the command starts, so that it finds the warm interpreter.
      wait_warm_interpreter(warm);
      timeline.add("warm start", warm_started, boottime_ns());
    }
    if (nvidia && config.modules_lock) timeline.add(nvidia->lock_modules());
    // The command (pyinit run) reuses the scan and the NCCL files instead of
    // repeating them, and starts its timeline where this one ends.
    timeline.measure("exec", [] {});
    write_boot_state(kBootStateDir, read_boot_id(), *topo, nccl ? &*nccl : nullptr,
                     timeline.phases());
    boot_log(std::string("state: ") + kBootStateDir + "/node.json written");
    for (const auto& [key, value] : env) setenv(key.c_str(), value.c_str(), 1);
    SupervisorOptions options;
    options.command = config.command;
    options.grace_ms = config.grace_s * 1000;
    options.log = boot_log;
    boot_log("exec: " + config.command[0]);
    status = supervise(options);
    boot_log("command exited with status " + std::to_string(status));
  } catch (const std::exception& e) {
    boot_log(std::string("fatal: ") + e.what());
  }
  end_all_processes(config.grace_s * 1000, boot_log);
  end_machine(config.end);
}

}  // namespace pod_init
