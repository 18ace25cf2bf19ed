#include "init/nvidia_bringup.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.hpp"
#include "common/error.hpp"
#include "common/line_input.hpp"
#include "common/sysfs.hpp"
#include "init/kernel_modules.hpp"
#include "init/nvml_state.hpp"

namespace pod_init {

namespace {

constexpr uint16_t kVendorNvidia = 0x10de;
constexpr uint32_t kBridgeOtherClass = 0x0680;  // NVSwitches show as "other bridge"
constexpr unsigned kPollMs = 10;
// NVML's own answer comes after the fabric's deadline: this much later is a hang.
constexpr unsigned kWatchGraceS = 15;

std::string joined(const std::vector<std::string>& words, const char* separator = ", ") {
  std::string out;
  for (const std::string& word : words) out += (out.empty() ? "" : separator) + word;
  return out;
}

bool exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

}  // namespace

NvidiaHardware find_nvidia_hardware(const Topology& topo) {
  NvidiaHardware found;
  for (const PciDevice& device : topo.devices) {
    if (device.vendor != kVendorNvidia) continue;
    if (device.kind == DeviceKind::Gpu) found.gpus.push_back(device.bdf);
    if (device.class_code >> 8 == kBridgeOtherClass) found.nvswitches.push_back(device.bdf);
  }
  return found;
}

bool holds_nvidia_driver(const std::string& release_dir) {
  std::vector<std::string> order;
  std::string missing;
  return modules_to_load(release_dir, {"nvidia"}, &order, &missing) == 0;
}

NvidiaBringup::NvidiaBringup(NvidiaBringupOptions options) : options_(std::move(options)) {}

NvidiaBringup::~NvidiaBringup() {
  if (watch_output_ >= 0) close(watch_output_);
  for (int fd : held_) close(fd);
}

void NvidiaBringup::log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

void NvidiaBringup::start(const NvidiaHardware& hardware) {
  hardware_ = hardware;
  const uint64_t modules_start = boottime_ns();
  load_modules_step();
  const uint64_t gpus_start = boottime_ns();
  phases_.push_back(boot_phase("nvidia modules", modules_start, gpus_start));
  wait_for_gpus();
  make_nodes();
  const uint64_t persistence_start = boottime_ns();
  phases_.push_back(boot_phase("gpu wait", gpus_start, persistence_start));
  start_persistence();
  phases_.push_back(boot_phase("persistence", persistence_start, boottime_ns()));
  start_fabric_manager();
  start_watch();
}

void NvidiaBringup::load_modules_step() {
  const std::string& release = options_.release_dir;
  const std::string dep_file = release + "/modules.dep";
  std::vector<std::string> wanted = {"nvidia", "nvidia_modeset", "nvidia_uvm"};
  if (access(dep_file.c_str(), R_OK) != 0) {
    int err = errno;
    // A kernel that has the driver already (loaded by other hands, or a VM's
    // kernel with it built in) needs no module files: say what is there.
    if (!exists(options_.sys_module_dir + "/nvidia")) throw SysError(err, "read", dep_file);
    for (const std::string& name : wanted) {
      bool loaded = exists(options_.sys_module_dir + "/" + name);
      log("nvidia: module " + name + (loaded ? " already loaded" : " not loaded") + " (no " +
          dep_file + ")");
    }
    return;
  }
  std::vector<std::string> order;
  std::string missing;
  // nvidia-peermem (GPUDirect RDMA) where the driver has it and its InfiniBand core is there.
  std::vector<std::string> with_peermem = wanted;
  with_peermem.emplace_back("nvidia_peermem");
  if (modules_to_load(release, with_peermem, &order, &missing) == 0) {
    wanted = with_peermem;
  } else if (int rc = modules_to_load(release, wanted, &order, &missing); rc == -ENOENT) {
    throw std::runtime_error("nvidia: module " + missing + " is not in " + dep_file);
  } else if (rc < 0) {
    throw SysError(-rc, "read", dep_file);
  }
  if (options_.dry_run) {
    for (const std::string& name : order) {
      bool loaded = exists(options_.sys_module_dir + "/" + name);
      log("nvidia: module " + name + (loaded ? " already loaded" : " not loaded (dry run)"));
    }
    return;
  }
  std::vector<ModuleLoad> loads;
  int rc = load_modules(release, wanted, &loads, &missing, {{"nvidia", options_.nvreg}},
                        options_.sys_module_dir);
  for (const ModuleLoad& load : loads) {
    log(module_load_line(load));
    if (load.name == "nvidia") driver_load_started_ns_ = load.started_ns;
  }
  if (!options_.nvreg.empty()) log("nvidia: parameters " + options_.nvreg);
  if (rc < 0) throw SysError(-rc, "load module " + (loads.empty() ? missing : loads.back().name));
}

void NvidiaBringup::wait_for_gpus() {
  const uint64_t wait_started_ns = boottime_ns();
  std::vector<std::string> unbound;
  for (;;) {
    unbound.clear();
    for (const std::string& bdf : hardware_.gpus) {
      if (!exists(options_.proc_dir + "/driver/nvidia/gpus/" + bdf)) unbound.push_back(bdf);
    }
    if (unbound.empty()) break;
    if (boottime_ns() - wait_started_ns >= uint64_t{options_.deadline_s} * 1000000000) {
      throw std::runtime_error(
          "nvidia: " + std::to_string(unbound.size()) + " of " +
          std::to_string(hardware_.gpus.size()) + " GPUs not bound by the driver after " +
          std::to_string(options_.deadline_s) + " s: " + joined(unbound) + " (no " +
          options_.proc_dir + "/driver/nvidia/gpus/BDF; the kernel log says why)");
    }
    usleep(kPollMs * 1000);
  }
  // The driver binds GPUs asynchronously from its own load, while the modules after it load
  // and their lines are written: counting from there is the driver's time to bind.
  const uint64_t since = driver_load_started_ns_ != 0 ? driver_load_started_ns_ : wait_started_ns;
  log("nvidia: " + std::to_string(hardware_.gpus.size()) + " GPUs bound by the driver after " +
      std::to_string((boottime_ns() - since) / 1000000) + " ms");
}

void NvidiaBringup::make_nodes() {
  std::string devices;
  if (int rc = sysfs::read_text(options_.proc_dir + "/devices", &devices); rc < 0) {
    throw SysError(-rc, "read", options_.proc_dir + "/devices");
  }
  std::vector<DeviceNode> nodes =
      nvidia_device_nodes(devices, static_cast<int>(hardware_.gpus.size()), options_.dev_dir);
  if (nodes.empty()) {
    throw std::runtime_error("nvidia: the driver registered no character device (" +
                             options_.proc_dir + "/devices names no nvidia)");
  }
  if (options_.dry_run) {
    int present = 0;
    for (const DeviceNode& node : nodes) present += exists(node.path);
    log("nvidia: " + std::to_string(present) + " of " + std::to_string(nodes.size()) +
        " device nodes present (dry run: none made)");
    return;
  }
  if (int rc = make_device_nodes(nodes); rc < 0) throw SysError(-rc, "mknod (NVIDIA device nodes)");
  log("nvidia: " + std::to_string(nodes.size()) + " device nodes made");
}

void NvidiaBringup::start_persistence() {
  if (options_.dry_run) return;  // NVML's watch reads each GPU's mode
  if (access(options_.persistenced.c_str(), X_OK) == 0) {
    const uint64_t start = monotonic_ms();
    // It initialises every GPU, then leaves its daemon running and returns.
    int status = wait_exit(spawn({options_.persistenced}, nullptr),
                           start + uint64_t{options_.deadline_s} * 1000);
    if (status != 0) {
      throw std::runtime_error(
          options_.persistenced +
          (status < 0 ? " did not return within " + std::to_string(options_.deadline_s) + " s"
                      : " exited with status " + std::to_string(status)));
    }
    log("persistence: nvidia-persistenced started in " + std::to_string(monotonic_ms() - start) +
        " ms");
    return;
  }
  // No daemon in the image: the driver keeps a GPU initialised while a file
  // on it is open, so PID 1 holds them for the machine's life, and NVML's
  // persistence mode is set as well (the watch does it).
  std::vector<std::string> paths = {options_.dev_dir + "/nvidiactl"};
  for (size_t i = 0; i < hardware_.gpus.size(); ++i) {
    paths.push_back(options_.dev_dir + "/nvidia" + std::to_string(i));
  }
  for (const std::string& path : paths) {
    int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) throw SysError(errno, "open (persistence)", path);
    held_.push_back(fd);
  }
  persistence_by_nvml_ = true;
  log("persistence: PID 1 holds " + options_.dev_dir + "/nvidiactl and " +
      std::to_string(hardware_.gpus.size()) +
      " GPUs open (the image has no nvidia-persistenced); NVML sets their persistence mode");
}

void NvidiaBringup::start_fabric_manager() {
  if (hardware_.nvswitches.empty()) return;
  fabric_started_ns_ = boottime_ns();
  const std::string count = std::to_string(hardware_.nvswitches.size());
  if (options_.dry_run) {
    log("fabric: " + count + " NVSwitches; the fabric manager is not started (dry run)");
    return;
  }
  if (access(options_.fabric_manager.c_str(), X_OK) != 0) {
    throw std::runtime_error("fabric: " + count + " NVSwitches (" + joined(hardware_.nvswitches) +
                             ") need nv-fabricmanager, and " + options_.fabric_manager +
                             " is not in the image");
  }
  int status = wait_exit(spawn({options_.fabric_manager, "-c", options_.fabric_config}, nullptr),
                         monotonic_ms() + uint64_t{options_.deadline_s} * 1000);
  if (status != 0) {
    throw std::runtime_error(
        options_.fabric_manager +
        (status < 0 ? " did not return within " + std::to_string(options_.deadline_s) + " s"
                    : " exited with status " + std::to_string(status)) +
        " (its log: /var/log/fabricmanager.log)");
  }
  log("fabric: nv-fabricmanager started for " + count + " NVSwitches");
}

void NvidiaBringup::start_watch() {
  if (hardware_.gpus.empty()) return;
  if (access(options_.helper.c_str(), X_OK) != 0) {
    if (!hardware_.nvswitches.empty()) {
      throw std::runtime_error("fabric: " + options_.helper +
                               " is not in the image: the fabric state cannot be read");
    }
    log("nvidia: no " + options_.helper + ": persistence and NVLinks unread");
    return;
  }
  std::vector<std::string> argv = {options_.helper};
  if (persistence_by_nvml_) argv.emplace_back("--enable-persistence");
  if (!hardware_.nvswitches.empty()) {
    argv.emplace_back("--wait-fabric");
    argv.push_back(std::to_string(options_.deadline_s));
  }
  argv.insert(argv.end(), hardware_.gpus.begin(), hardware_.gpus.end());
  watch_started_ns_ = boottime_ns();
  watch_ = spawn(argv, &watch_output_);
}

GpuDetailsMap NvidiaBringup::finish() {
  GpuDetailsMap details;
  if (watch_ < 0) return details;
  const uint64_t deadline = monotonic_ms() + (uint64_t{options_.deadline_s} + kWatchGraceS) * 1000;
  std::string text;
  char buffer[4096];
  for (;;) {
    int64_t left = static_cast<int64_t>(deadline) - static_cast<int64_t>(monotonic_ms());
    if (left <= 0) break;
    pollfd ready{watch_output_, POLLIN, 0};
    int got = poll(&ready, 1, static_cast<int>(left));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    ssize_t n = read(watch_output_, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || text.size() > (1u << 20)) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  // Its output closed: it is exiting (or hung past the deadline, and is killed).
  int status = wait_exit(watch_, std::min(deadline, monotonic_ms() + kWatchGraceS * 1000));
  if (status < 0) {
    kill(watch_, SIGKILL);
    waitpid(watch_, nullptr, 0);
  }
  watch_ = -1;
  std::vector<GpuNvmlState> states;
  std::vector<std::string> messages;
  uint64_t waited_ms = 0;
  for_each_line(text, [&](int, std::string_view line) {
    GpuNvmlState state;
    if (parse_gpu_state(line, &state)) {
      states.push_back(state);
    } else if (line.rfind("waited_ms ", 0) == 0) {
      waited_ms = static_cast<uint64_t>(sysfs::parse_int(line.substr(10)).value_or(0));
    } else if (!line.empty()) {
      messages.emplace_back(line);
    }
    return 0;
  });
  const bool switched = !hardware_.nvswitches.empty();
  if (status != 0 && status != 3) {
    std::string why =
        messages.empty()
            ? options_.helper +
                  (status < 0 ? " did not answer" : " exited with status " + std::to_string(status))
            : messages.front();
    if (switched) throw std::runtime_error("fabric: " + why);
    log("nvidia: " + why + " (persistence and NVLinks unread)");
    return details;
  }
  if (switched)
    phases_.push_back(
        boot_phase("fabric", fabric_started_ns_, watch_started_ns_ + waited_ms * 1000000));
  std::vector<std::string> waiting, persistence_off;
  for (const GpuNvmlState& state : states) {
    details[state.bdf] = state.details;
    if (!fabric_ready(state)) {
      waiting.push_back(state.bdf + " " + fabric_state_name(state.fabric) +
                        (state.fabric_status != 0
                             ? " (status " + std::to_string(state.fabric_status) + ")"
                             : ""));
    }
    if (state.persistence == 0) persistence_off.push_back(state.bdf);
    log("nvidia: " + state.bdf + " persistence " +
        (state.persistence < 0 ? "unknown"
         : state.persistence   ? "on"
                               : "off") +
        ", fabric " + fabric_state_name(state.fabric) + ", sm " + std::to_string(state.details.sm) +
        ", " + std::to_string(state.details.nvlinks.size()) + " NVLink peers");
  }
  if (status == 3 || (switched && !waiting.empty())) {
    throw std::runtime_error("fabric: not complete after " + std::to_string(options_.deadline_s) +
                             " s: " + joined(waiting) +
                             " (the fabric manager's log: /var/log/fabricmanager.log)");
  }
  if (switched) {
    log("fabric: complete on " + std::to_string(states.size()) + " GPUs after " +
        std::to_string(waited_ms) + " ms");
  }
  if (!persistence_off.empty()) {
    log("persistence: off on " + joined(persistence_off) +
        (options_.dry_run ? " (dry run: left as it is)" : ""));
  }
  return details;
}

BootPhase NvidiaBringup::lock_modules() {
  const uint64_t start = boottime_ns();
  const std::string path = options_.proc_dir + "/sys/kernel/modules_disabled";
  if (options_.dry_run) {
    log("modules: loading not locked (dry run)");
  } else {
    int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, "1\n", 2) != 2) {
      int err = errno;
      if (fd >= 0) close(fd);
      throw SysError(err, "write", path);
    }
    close(fd);
    log("modules: loading locked (" + path + " = 1)");
  }
  return boot_phase("modules lock", start, boottime_ns());
}

pid_t NvidiaBringup::spawn(const std::vector<std::string>& argv, int* output) {
  int pipe_fds[2] = {-1, -1};
  if (output != nullptr && pipe2(pipe_fds, O_CLOEXEC) != 0) throw SysError(errno, "pipe");
  // A mount namespace of its own: the daemons and NVML keep the boot image's
  // /dev, /proc, /sys and /run when PID 1 moves them into the new root.
  pid_t pid = options_.private_mounts
                  ? static_cast<pid_t>(syscall(SYS_clone, CLONE_NEWNS | SIGCHLD, 0, 0, 0, 0))
                  : fork();
  if (pid == 0) {
    if (output != nullptr) {
      dup2(pipe_fds[1], STDOUT_FILENO);
      dup2(pipe_fds[1], STDERR_FILENO);
    }
    if (!options_.library_path.empty()) setenv("LD_LIBRARY_PATH", options_.library_path.c_str(), 1);
    std::vector<char*> args;
    for (const std::string& word : argv) args.push_back(const_cast<char*>(word.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::fprintf(stderr, "%s: %s\n", argv[0].c_str(), errno_text(errno).c_str());
    _exit(127);
  }
  int err = errno;
  if (output != nullptr) {
    close(pipe_fds[1]);
    if (pid < 0) {
      close(pipe_fds[0]);
    } else {
      *output = pipe_fds[0];
    }
  }
  if (pid < 0) throw SysError(err, "start", argv[0]);
  return pid;
}

int NvidiaBringup::wait_exit(pid_t pid, uint64_t deadline_ms) {
  for (;;) {
    int status = 0;
    pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (done < 0 && errno != EINTR) return -1;
    if (monotonic_ms() >= deadline_ms) return -1;
    usleep(kPollMs * 1000);
  }
}

}  // namespace pod_init
