// Loading kernel modules without modprobe: names resolved through modules.dep
// (dependencies first, each once), then finit_module(). Also the NVIDIA
// device nodes, which on a normal system nvidia-modprobe would create.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/line_input.hpp"

namespace pod_init {

// "kernel/drivers/nvme/host/nvme-core.ko.xz" -> "nvme_core" (the kernel's own
// spelling: '-' and '_' are the same in module names).
std::string module_name(std::string_view path_or_name);

struct ModuleIndex {
  std::map<std::string, std::string> path;               // name -> path under the release dir
  std::map<std::string, std::vector<std::string>> deps;  // name -> names of its dependencies
  std::set<std::string> builtin;                         // names in modules.builtin
};

// Parses modules.dep ("path: dep-path dep-path ..."). -EINVAL with `error` on a bad line.
int parse_modules_dep(std::string_view text, ModuleIndex* index, LineError* error);
void parse_modules_builtin(std::string_view text, ModuleIndex* index);

// The names to load for `wanted`, dependencies before the modules that need
// them, each once, built-in ones left out. -ENOENT with `missing` set when a
// name is neither in modules.dep nor built in; -ELOOP on a dependency cycle.
int module_load_order(const ModuleIndex& index, const std::vector<std::string>& wanted,
                      std::vector<std::string>* order, std::string* missing);

// The modules.dep lines ("path: dep-path ...") of `wanted` and of everything
// they need, dependencies first, from `release_dir` (/lib/modules/RELEASE):
// what a boot image carries of the release, from the same resolution PID 1
// loads with. SysError when modules.dep cannot be read; InputError naming the
// file for a bad line, a name that is neither there nor built in, or a cycle.
std::vector<std::string> module_dep_lines(const std::string& release_dir,
                                          const std::vector<std::string>& wanted);

struct ModuleLoad {
  std::string name;
  int result = 0;  // 0, or -errno from open or finit_module (-EEXIST counts as loaded)
  uint64_t nanoseconds = 0;
  uint64_t started_ns = 0;  // CLOCK_BOOTTIME when its load began (0 when already loaded)
  bool already = false;     // loaded before we asked: nothing was read or handed over
};

// The running kernel's module folder: /lib/modules/$(uname -r).
std::string running_release_dir();

// "module NAME loaded (12.3 ms)", "... already loaded", "... failed (...)".
std::string module_load_line(const ModuleLoad& load);

// Loads `wanted` and what they need from `release_dir` (/lib/modules/RELEASE),
// each with its entry of `params` ("a=1 b=2", by module name) if it has one.
// Compressed modules (.ko.xz, .ko.zst, .ko.gz) go to the kernel as they are,
// with MODULE_INIT_COMPRESSED_FILE. Stops at the first failure. Returns 0 or
// -errno (also -ENOENT for a name that does not exist, with `missing`).
// A module with a folder in `sys_module_dir` is loaded already and skipped.
int load_modules(const std::string& release_dir, const std::vector<std::string>& wanted,
                 std::vector<ModuleLoad>* loads, std::string* missing,
                 const std::map<std::string, std::string>& params = {},
                 const std::string& sys_module_dir = "/sys/module");

// The names `wanted` would load from `release_dir`, dependencies first; -errno
// as load_modules says.
int modules_to_load(const std::string& release_dir, const std::vector<std::string>& wanted,
                    std::vector<std::string>* order, std::string* missing);

struct DeviceNode {
  std::string path;
  unsigned major = 0, minor = 0;
};

// The NVIDIA nodes for `gpu_count` GPUs, majors from /proc/devices ("nvidia-frontend" or
// "nvidia", "nvidia-uvm"); empty when the driver is not loaded.
std::vector<DeviceNode> nvidia_device_nodes(std::string_view proc_devices, int gpu_count,
                                            const std::string& dev_dir = "/dev");

// Creates character devices (mode 0666), leaving existing ones. Returns 0 or the first -errno.
int make_device_nodes(const std::vector<DeviceNode>& nodes);

}  // namespace pod_init
