// pod-init: the node runtime's executable. Subcommands for now; running as
// PID 1 arrives with the boot image.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

#include "pod_init/error.hpp"
#include "pod_init/nccl_config.hpp"
#include "pod_init/report.hpp"
#include "pod_init/sysfs.hpp"
#include "pod_init/topology.hpp"

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFindings = 1;
constexpr int kExitUsage = 2;

constexpr const char* kUsage =
    "usage: pod-init topo [--sysfs-root DIR] [--json] [--expect-gpus N] [--no-bar0]\n"
    "       pod-init nccl [--sysfs-root DIR] [--hints FILE] [--hostfile FILE] [--out DIR]\n"
    "                     [--force-rings] [--socket-ifname NAME] [--channels N] [--proc-root DIR]\n"
    "\n"
    "  topo   PCIe topology of this node: GPU/NIC/NVMe matrix, links, BARs, findings.\n"
    "         Exit status 0 when no finding is an error, 1 otherwise, 2 for bad usage.\n"
    "  nccl   NCCL configuration: writes nccl-topo.xml, nccl-graph.xml, nccl.env (and\n"
    "         hosts with --hostfile) in DIR (default .) and prints the rings.\n"
    "         Exit status 0, 1 when sysfs or DIR cannot be used, 2 for bad input.\n";

int usage_error(const std::string& message) {
  std::fprintf(stderr, "pod-init: %s\n%s", message.c_str(), kUsage);
  return kExitUsage;
}

int run_topo(const std::vector<std::string>& args) {
  pod_init::ScanOptions options;
  bool json = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    auto next = [&]() -> const std::string* { return i + 1 < args.size() ? &args[++i] : nullptr; };
    if (arg == "--json") {
      json = true;
    } else if (arg == "--no-bar0") {
      options.probe_bar0 = false;
    } else if (arg == "--sysfs-root") {
      const std::string* value = next();
      if (!value || value->empty()) return usage_error("--sysfs-root needs a directory");
      options.sysfs_root = *value;
    } else if (arg == "--expect-gpus") {
      const std::string* value = next();
      auto count = value ? pod_init::sysfs::parse_int(*value) : std::nullopt;
      if (!count || *count < 0 || *count > 4096) {
        return usage_error("--expect-gpus needs a whole number from 0 to 4096");
      }
      options.expect_gpus = static_cast<int>(*count);
    } else if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return kExitOk;
    } else {
      return usage_error("topo: unknown argument '" + arg + "'");
    }
  }
  try {
    pod_init::Topology topo = pod_init::scan(options);
    std::string out = json ? pod_init::topology_json(topo) : pod_init::topology_text(topo);
    std::fwrite(out.data(), 1, out.size(), stdout);
    return pod_init::has_errors(topo.findings) ? kExitFindings : kExitOk;
  } catch (const pod_init::SysError& e) {
    std::fprintf(stderr, "pod-init: %s\n", e.what());
    return kExitFindings;
  }
}

int run_nccl(const std::vector<std::string>& args) {
  pod_init::NcclRequest request;
  const std::pair<const char*, std::string*> paths[] = {
      {"--sysfs-root", &request.sysfs_root}, {"--proc-root", &request.proc_root},
      {"--hints", &request.hints_path},      {"--hostfile", &request.hostfile_path},
      {"--out", &request.out_dir},           {"--socket-ifname", &request.socket_ifname}};
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    const std::string* value = i + 1 < args.size() ? &args[i + 1] : nullptr;
    auto path = std::find_if(std::begin(paths), std::end(paths),
                             [&](const auto& option) { return arg == option.first; });
    if (path != std::end(paths)) {
      if (!value || value->empty()) return usage_error(arg + " needs a value");
      *path->second = *value;
      ++i;
    } else if (arg == "--force-rings") {
      request.force_rings = true;
    } else if (arg == "--channels") {
      auto count = value ? pod_init::sysfs::parse_int(*value) : std::nullopt;
      if (!count || *count < 1 || *count > pod_init::kMaxChannels) {
        return usage_error("--channels needs a whole number from 1 to 32");
      }
      request.channels = static_cast<int>(*count);
      ++i;
    } else if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return kExitOk;
    } else {
      return usage_error("nccl: unknown argument '" + arg + "'");
    }
  }
  for (char** entry = environ; *entry != nullptr; ++entry) {
    std::string text = *entry;
    size_t equals = text.find('=');
    if (text.rfind("NCCL_", 0) == 0 && equals != std::string::npos) {
      request.environment[text.substr(0, equals)] = text.substr(equals + 1);
    }
  }
  try {
    pod_init::NcclConfig config = pod_init::build_nccl_config(request);
    pod_init::write_nccl_files(config);
    std::string out = pod_init::nccl_summary(config);
    std::fwrite(out.data(), 1, out.size(), stdout);
    return kExitOk;
  } catch (const pod_init::InputError& e) {
    std::fprintf(stderr, "pod-init: %s\n", e.what());
    return kExitUsage;
  } catch (const pod_init::SysError& e) {
    std::fprintf(stderr, "pod-init: %s\n", e.what());
    return kExitFindings;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) return usage_error("missing command");
  std::string command = args.front();
  args.erase(args.begin());
  if (command == "topo") return run_topo(args);
  if (command == "nccl") return run_nccl(args);
  if (command == "-h" || command == "--help") {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  return usage_error("unknown command '" + command + "'");
}
