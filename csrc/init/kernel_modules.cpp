#include "init/kernel_modules.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/clock.hpp"
#include "common/error.hpp"
#include "common/sysfs.hpp"

namespace pod_init {

namespace {

constexpr unsigned kCompressedFile = 4;   // MODULE_INIT_COMPRESSED_FILE (Linux 5.17)
constexpr size_t kIndexLimit = 64 << 20;  // modules.dep is about 1 MiB for a whole distribution

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

int visit(const ModuleIndex& index, const std::string& name, std::set<std::string>* done,
          std::set<std::string>* active, std::vector<std::string>* order, std::string* missing) {
  if (done->count(name) || index.builtin.count(name)) return 0;
  auto deps = index.deps.find(name);
  if (deps == index.deps.end()) {
    *missing = name;
    return -ENOENT;
  }
  if (!active->insert(name).second) return -ELOOP;
  for (const std::string& dep : deps->second) {
    if (int rc = visit(index, dep, done, active, order, missing); rc < 0) return rc;
  }
  active->erase(name);
  done->insert(name);
  order->push_back(name);
  return 0;
}

}  // namespace

std::string module_name(std::string_view path_or_name) {
  size_t slash = path_or_name.rfind('/');
  std::string name(slash == std::string_view::npos ? path_or_name : path_or_name.substr(slash + 1));
  size_t ko = name.find(".ko");
  if (ko != std::string::npos) name.resize(ko);
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  return name;
}

int parse_modules_dep(std::string_view text, ModuleIndex* index, LineError* error) {
  return for_each_fields_line(text, [&](int number, const std::vector<std::string>& fields) {
    const std::string& first = fields[0];
    if (first.size() < 2 || first.back() != ':') {
      return fail_line(error, number, "expected 'path: dependencies'");
    }
    std::string path = first.substr(0, first.size() - 1);
    std::string name = module_name(path);
    index->path[name] = path;
    std::vector<std::string>& deps = index->deps[name];
    for (size_t i = 1; i < fields.size(); ++i) deps.push_back(module_name(fields[i]));
    return 0;
  });
}

void parse_modules_builtin(std::string_view text, ModuleIndex* index) {
  for_each_line(text, [&](int, std::string_view line) {
    if (!line.empty()) index->builtin.insert(module_name(line));
    return 0;
  });
}

int module_load_order(const ModuleIndex& index, const std::vector<std::string>& wanted,
                      std::vector<std::string>* order, std::string* missing) {
  std::set<std::string> done, active;
  for (const std::string& name : wanted) {
    if (int rc = visit(index, module_name(name), &done, &active, order, missing); rc < 0) {
      return rc;
    }
  }
  return 0;
}

namespace {

// modules.dep and modules.builtin of a release into `index`. 0, or -errno with
// `where` naming the file (and the line of a malformed one).
int read_module_index(const std::string& release_dir, ModuleIndex* index, std::string* where,
                      int* line) {
  std::string text;
  *where = release_dir + "/modules.dep";
  int rc = sysfs::read_text(*where, &text, kIndexLimit);
  if (rc < 0) return rc;
  LineError error;
  if ((rc = parse_modules_dep(text, index, &error)) < 0) {
    *line = error.line;
    return rc;
  }
  if (sysfs::read_text(release_dir + "/modules.builtin", &text, kIndexLimit) == 0) {
    parse_modules_builtin(text, index);
  }
  return 0;
}

}  // namespace

std::vector<std::string> module_dep_lines(const std::string& release_dir,
                                          const std::vector<std::string>& wanted) {
  ModuleIndex index;
  std::string dep_file, missing;
  int line = 0;
  int rc = read_module_index(release_dir, &index, &dep_file, &line);
  if (rc == -EINVAL) throw InputError(dep_file, line, "expected 'path: dependencies'");
  if (rc < 0) throw SysError(-rc, "read", dep_file);
  std::vector<std::string> order;
  rc = module_load_order(index, wanted, &order, &missing);
  if (rc == -ENOENT) {
    throw InputError("", 0, "module " + missing + ": not in " + dep_file + " nor built in");
  }
  if (rc == -ELOOP) throw InputError(dep_file, 0, "a dependency cycle among the modules asked for");
  std::vector<std::string> lines;
  for (const std::string& name : order) {
    std::string entry = index.path.at(name) + ":";
    for (const std::string& dep : index.deps.at(name)) entry += " " + index.path.at(dep);
    lines.push_back(entry);
  }
  return lines;
}

namespace {

int index_and_order(const std::string& release_dir, const std::vector<std::string>& wanted,
                    ModuleIndex* index, std::vector<std::string>* order, std::string* missing) {
  int line = 0;
  int rc = read_module_index(release_dir, index, missing, &line);
  if (rc < 0) {
    if (line > 0) *missing += ":" + std::to_string(line);
    return rc;
  }
  return module_load_order(*index, wanted, order, missing);
}

}  // namespace

int modules_to_load(const std::string& release_dir, const std::vector<std::string>& wanted,
                    std::vector<std::string>* order, std::string* missing) {
  ModuleIndex index;
  return index_and_order(release_dir, wanted, &index, order, missing);
}

int load_modules(const std::string& release_dir, const std::vector<std::string>& wanted,
                 std::vector<ModuleLoad>* loads, std::string* missing,
                 const std::map<std::string, std::string>& params,
                 const std::string& sys_module_dir) {
  ModuleIndex index;
  std::vector<std::string> order;
  if (int rc = index_and_order(release_dir, wanted, &index, &order, missing); rc < 0) return rc;
  for (const std::string& name : order) {
    ModuleLoad load{name};
    if (access((sys_module_dir + "/" + name).c_str(), F_OK) == 0) {
      load.already = true;
      loads->push_back(load);
      continue;
    }
    const std::string& path = index.path.at(name);
    load.started_ns = boottime_ns();
    int fd = open((release_dir + "/" + path).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      load.result = -errno;
    } else {
      bool compressed = ends_with(path, ".xz") || ends_with(path, ".zst") || ends_with(path, ".gz");
      auto given = params.find(name);
      const char* values = given == params.end() ? "" : given->second.c_str();
      if (syscall(SYS_finit_module, fd, values, compressed ? kCompressedFile : 0u) != 0 &&
          errno != EEXIST) {
        load.result = -errno;
      }
      close(fd);
    }
    load.nanoseconds = boottime_ns() - load.started_ns;
    loads->push_back(load);
    if (load.result < 0) return load.result;
  }
  return 0;
}

std::string running_release_dir() {
  utsname uts{};
  uname(&uts);
  return std::string("/lib/modules/") + uts.release;
}

std::string module_load_line(const ModuleLoad& load) {
  if (load.already) return "module " + load.name + " already loaded";
  char line[200];
  std::snprintf(line, sizeof line, "module %s %s (%.1f ms)", load.name.c_str(),
                load.result == 0 ? "loaded" : "failed",
                static_cast<double>(load.nanoseconds) / 1e6);
  return line;
}

std::vector<DeviceNode> nvidia_device_nodes(std::string_view proc_devices, int gpu_count,
                                            const std::string& dev_dir) {
  // /proc/devices: a "Character devices:" section of "MAJOR name" lines, then "Block devices:".
  long frontend = -1, uvm = -1;
  bool character = false;
  for_each_fields_line(proc_devices, [&](int, const std::vector<std::string>& words) {
    if (words[0] == "Character") character = true;
    if (words[0] == "Block") character = false;
    if (!character || words.size() != 2) return 0;
    auto major = sysfs::parse_int(words[0]);
    if (!major) return 0;
    if (words[1] == "nvidia-frontend" || (words[1] == "nvidia" && frontend < 0)) frontend = *major;
    if (words[1] == "nvidia-uvm") uvm = *major;
    return 0;
  });
  std::vector<DeviceNode> nodes;
  if (frontend < 0) return nodes;
  auto major = static_cast<unsigned>(frontend);
  nodes.push_back({dev_dir + "/nvidiactl", major, 255});
  for (int i = 0; i < gpu_count; ++i) {
    nodes.push_back({dev_dir + "/nvidia" + std::to_string(i), major, static_cast<unsigned>(i)});
  }
  if (uvm >= 0) {
    nodes.push_back({dev_dir + "/nvidia-uvm", static_cast<unsigned>(uvm), 0});
    nodes.push_back({dev_dir + "/nvidia-uvm-tools", static_cast<unsigned>(uvm), 1});
  }
  return nodes;
}

int make_device_nodes(const std::vector<DeviceNode>& nodes) {
  for (const DeviceNode& node : nodes) {
    if (mknod(node.path.c_str(), S_IFCHR | 0666, makedev(node.major, node.minor)) != 0 &&
        errno != EEXIST) {
      return -errno;
    }
    // mknod honours the umask; the driver's nodes are meant for every user.
    if (chmod(node.path.c_str(), 0666) != 0) return -errno;
  }
  return 0;
}

}  // namespace pod_init
