// pod-init: the node runtime's executable. As the machine's init (PID 1 from
// the boot image) it brings the node up and runs the workload; otherwise
// `pod-init [--grace S] -- COMMAND...` supervises a command as tini does, and
// subcommands inspect the node.
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

extern char** environ;

#include "common/clock.hpp"
#include "common/error.hpp"
#include "common/sha256.hpp"
#include "common/sysfs.hpp"
#include "init/init_config.hpp"
#include "init/kernel_modules.hpp"
#include "init/machine_init.hpp"
#include "init/supervisor.hpp"
#include "io/aligned_buffer.hpp"
#include "io/direct_reader.hpp"
#include "nccl/nccl_config.hpp"
#include "topology/report.hpp"
#include "topology/topology.hpp"

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFindings = 1;
constexpr int kExitUsage = 2;

struct CommandHelp {
  const char* name;  // "" for the supervisor (`pod-init -- COMMAND`)
  const char* usage;
  const char* text;
};

constexpr CommandHelp kCommands[] = {
    {"",
     "pod-init [--grace SECONDS] [-g] [-e CODE]... [-v] [--end-with-parent] -- COMMAND "
     "[ARGS...]\n",
     "  --      Runs COMMAND as a child, as tini does: forwards TERM, INT, HUP, USR1, USR2,\n"
     "          QUIT, WINCH; reaps every process (a child subreaper when not PID 1); after\n"
     "          TERM or INT KILLs a command still running after the grace period (default\n"
     "          10 s). When the command has ended, what it left running gets TERM and,\n"
     "          after the grace, KILL. -g: the command gets a process group of its own and\n"
     "          signals go to the group; -e CODE: exit status CODE counts as 0 (repeatable);\n"
     "          -v: a line per signal forwarded and process reaped; --end-with-parent: when\n"
     "          the process that started pod-init dies, even by KILL, the command and all\n"
     "          it left are KILLed at once (exit 137). As PID 1 of the machine (the boot\n"
     "          image's /init) pod-init reads podinit.* from the kernel command line\n"
     "          instead; see docs/pod-init.md.\n"},
    {"topo", "pod-init topo [--sysfs-root DIR] [--json] [--expect-gpus N] [--no-bar0]\n",
     "  topo    PCIe topology of this node: GPU/NIC/NVMe matrix, links, BARs, findings.\n"
     "          --sysfs-root DIR (default /sys), --json one document, --expect-gpus N\n"
     "          (0 to 4096) an error finding for fewer, --no-bar0 no BAR0 mapping.\n"},
    {"nccl",
     "pod-init nccl [--sysfs-root DIR] [--hints FILE] [--hostfile FILE [--node K]]\n"
     "              [--out DIR] [--force-rings] [--socket-ifname NAME] [--channels N]\n"
     "              [--proc-root DIR]\n",
     "  nccl    NCCL configuration: writes nccl-topo.xml, nccl-graph.xml, nccl.env (and\n"
     "          hosts with --hostfile) in DIR (default .) and prints the rings. Defaults:\n"
     "          --sysfs-root /sys, --proc-root /proc, --channels from the ring's bandwidth\n"
     "          (1 to 32), --socket-ifname the interface that reaches node 0. --node K\n"
     "          writes node K's files (of the hostfile's nodes, this machine's topology)\n"
     "          instead of this machine's own: a plan for a cluster of such nodes.\n"},
    {"read", "pod-init read PATH [--offset BYTES] [--length BYTES] [--queue-depth N]\n",
     "  read    Reads PATH (a file or block device) with the O_DIRECT reader and prints\n"
     "          the SHA-256 of the bytes read. Defaults: --offset 0, --length to the end,\n"
     "          --queue-depth 32 (1 to 4096).\n"},
    {"modules", "pod-init modules [--release-dir DIR] NAME...\n",
     "  modules The modules.dep lines of NAME... and of everything they need, dependencies\n"
     "          first, from DIR (default /lib/modules/$(uname -r)): what PID 1 loads for\n"
     "          podinit.modules, and what initramfs/build puts in the image.\n"},
    {"params", "pod-init params LINE...\n",
     "  params  Checks podinit.KEY=VALUE lines as PID 1 reads /etc/pod-init.conf: one line\n"
     "          per problem (initramfs/build runs it).\n"},
};

constexpr const char* kExitStatus =
    "exit status:\n"
    "  0    success\n"
    "  1    a system call failed (the message names the file and the errno text), or the\n"
    "       node is unhealthy (a finding of severity error, a failed preflight)\n"
    "  2    bad usage or bad content (the message names the option, or the file and line)\n"
    "  N    a supervised command's own status (pod-init -- CMD, pyinit run); 128+N when\n"
    "       signal N ended it, 127 when it was not found, 126 when it could not be run\n"
    "  124  pyinit run --stall-timeout: a rank made no step for that long, and the run\n"
    "       ended (its stall event names the rank and where it was)\n";

// The usage lines of every command (`command` null) or of one.
std::string usage_lines(const char* command) {
  std::string usage;
  for (const CommandHelp& entry : kCommands) {
    if (command != nullptr && std::string(entry.name) != command) continue;
    usage += (usage.empty() ? "usage: " : "       ") + std::string(entry.usage);
  }
  return usage;
}

// Usage, what the command does, then the exit-status table.
std::string help(const char* command) {
  std::string text;
  for (const CommandHelp& entry : kCommands) {
    if (command == nullptr || std::string(entry.name) == command) text += entry.text;
  }
  return usage_lines(command) + "\n" + text + "\n" + kExitStatus;
}

int print_help(const char* command) {
  std::fputs(help(command).c_str(), stdout);
  return kExitOk;
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "pod-init: %s\n%s", message.c_str(), usage_lines(nullptr).c_str());
  return kExitUsage;
}

// Runs a subcommand's work, turning the API layer's exceptions into the exit
// status table: bad content 2, a failing system call 1, each one line.
template <typename Work>
int reporting_errors(Work work) {
  try {
    return work();
  } catch (const pod_init::InputError& e) {
    std::fprintf(stderr, "pod-init: %s\n", e.what());
    return kExitUsage;
  } catch (const pod_init::SysError& e) {
    std::fprintf(stderr, "pod-init: %s\n", e.what());
    return kExitFindings;
  }
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
      if (!count || *count < 0 || *count > pod_init::kMaxExpectedGpus) {
        return usage_error("--expect-gpus needs a whole number from 0 to " +
                           std::to_string(pod_init::kMaxExpectedGpus));
      }
      options.expect_gpus = static_cast<int>(*count);
    } else if (arg == "-h" || arg == "--help") {
      return print_help("topo");
    } else {
      return usage_error("topo: unknown argument '" + arg + "'");
    }
  }
  return reporting_errors([&] {
    pod_init::Topology topo = pod_init::scan(options);
    std::string out = json ? pod_init::topology_json(topo) : pod_init::topology_text(topo);
    std::fwrite(out.data(), 1, out.size(), stdout);
    return pod_init::has_errors(topo.findings) ? kExitFindings : kExitOk;
  });
}

int run_nccl(const std::vector<std::string>& args) {
  pod_init::NcclRequest options;  // the option fields; the request is made below
  std::string sysfs_root = "/sys", proc_root = "/proc", hints, hostfile;
  int node = -1;
  const std::pair<const char*, std::string*> paths[] = {
      {"--sysfs-root", &sysfs_root}, {"--proc-root", &proc_root},
      {"--hints", &hints},           {"--hostfile", &hostfile},
      {"--out", &options.out_dir},   {"--socket-ifname", &options.socket_ifname}};
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
      options.force_rings = true;
    } else if (arg == "--channels") {
      auto count = value ? pod_init::sysfs::parse_int(*value) : std::nullopt;
      if (!count || *count < 1 || *count > pod_init::kMaxChannels) {
        return usage_error("--channels needs a whole number from 1 to " +
                           std::to_string(pod_init::kMaxChannels));
      }
      options.channels = static_cast<int>(*count);
      ++i;
    } else if (arg == "--node") {
      auto index = value ? pod_init::sysfs::parse_int(*value) : std::nullopt;
      if (!index || *index < 0 || *index >= static_cast<int64_t>(pod_init::kMaxHosts)) {
        return usage_error("--node needs a node index from 0");
      }
      node = static_cast<int>(*index);
      ++i;
    } else if (arg == "-h" || arg == "--help") {
      return print_help("nccl");
    } else {
      return usage_error("nccl: unknown argument '" + arg + "'");
    }
  }
  return reporting_errors([&] {
    pod_init::NcclRequest request =
        pod_init::make_nccl_request(pod_init::scan({sysfs_root, -1, false}),
                                    {hints, proc_root, pod_init::process_environment()});
    request.nodes = pod_init::load_node_list(hostfile, "", node);
    request.out_dir = options.out_dir;
    request.socket_ifname = options.socket_ifname;
    request.force_rings = options.force_rings;
    request.channels = options.channels;
    pod_init::NcclConfig config = pod_init::build_nccl_config(request);
    pod_init::write_nccl_files(config);
    std::string out = pod_init::nccl_summary(config);
    std::fwrite(out.data(), 1, out.size(), stdout);
    return kExitOk;
  });
}

std::optional<uint64_t> parse_count(const std::string* text) {
  auto value = text ? pod_init::sysfs::parse_int(*text) : std::nullopt;
  if (!value || *value < 0) return std::nullopt;
  return static_cast<uint64_t>(*value);
}

int run_read(const std::vector<std::string>& args) {
  std::string path;
  uint64_t offset = 0, length = UINT64_MAX;
  uint64_t depth = 32;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string* value = i + 1 < args.size() ? &args[i + 1] : nullptr;
    uint64_t* target = args[i] == "--offset"        ? &offset
                       : args[i] == "--length"      ? &length
                       : args[i] == "--queue-depth" ? &depth
                                                    : nullptr;
    if (args[i] == "-h" || args[i] == "--help") return print_help("read");
    if (target != nullptr) {
      auto number = parse_count(value);
      if (!number) return usage_error(args[i] + " needs a whole number");
      *target = *number;
      ++i;
    } else if (path.empty() && !args[i].empty() && args[i][0] != '-') {
      path = args[i];
    } else {
      return usage_error("read: unexpected argument '" + args[i] + "'");
    }
  }
  if (path.empty()) return usage_error("read needs a PATH");
  return reporting_errors([&] {
    // The reader checks the depth's range (InputError, exit 2).
    pod_init::DirectReader reader(path, static_cast<int64_t>(std::min<uint64_t>(depth, INT64_MAX)),
                                  pod_init::BackendChoice::Auto);
    length = std::min(length, reader.size() > offset ? reader.size() - offset : 0);
    constexpr size_t kChunk = 8 << 20;
    pod_init::AlignedBuffer buffer(kChunk);
    if (buffer.data() == nullptr) throw pod_init::SysError(ENOMEM, "allocate a read buffer");
    pod_init::Sha256 sha;
    const uint64_t start = pod_init::monotonic_ns();
    uint64_t done = 0;
    while (done < length) {
      size_t want = static_cast<size_t>(std::min<uint64_t>(kChunk, length - done));
      size_t got = reader.read_into(buffer.data(), want, offset + done);
      sha.update(buffer.data(), got);
      done += got;
      if (got < want) break;
    }
    double seconds = static_cast<double>(pod_init::monotonic_ns() - start) / 1e9;
    std::printf(
        "%s: %llu bytes at offset %llu, sha256 %s (%s, block %u, %s, %.1f MB/s)\n", path.c_str(),
        static_cast<unsigned long long>(done), static_cast<unsigned long long>(offset),
        sha.hex_digest().c_str(), reader.direct() ? "direct" : "buffered", reader.block_size(),
        reader.backend().c_str(), seconds > 0 ? static_cast<double>(done) / seconds / 1e6 : 0.0);
    return kExitOk;
  });
}

int run_modules(const std::vector<std::string>& args) {
  std::string release_dir;
  std::vector<std::string> names;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--release-dir") {
      if (i + 1 >= args.size() || args[i + 1].empty()) {
        return usage_error("--release-dir needs a directory");
      }
      release_dir = args[++i];
    } else if (args[i] == "-h" || args[i] == "--help") {
      return print_help("modules");
    } else if (!args[i].empty() && args[i][0] != '-') {
      names.push_back(args[i]);
    } else {
      return usage_error("modules: unknown argument '" + args[i] + "'");
    }
  }
  if (names.empty()) return usage_error("modules needs at least one module NAME");
  if (release_dir.empty()) {
    utsname uts{};
    uname(&uts);
    release_dir = std::string("/lib/modules/") + uts.release;
  }
  return reporting_errors([&] {
    for (const std::string& line : pod_init::module_dep_lines(release_dir, names)) {
      std::printf("%s\n", line.c_str());
    }
    return kExitOk;
  });
}

int run_params(const std::vector<std::string>& args) {
  if (!args.empty() && (args[0] == "-h" || args[0] == "--help")) {
    return print_help("params");
  }
  std::string text;
  for (const std::string& line : args) text += line + "\n";
  pod_init::InitConfig config;
  std::vector<std::string> errors;
  pod_init::apply_init_file(text, "/etc/pod-init.conf", &config, &errors);
  for (const std::string& error : errors) std::fprintf(stderr, "pod-init: %s\n", error.c_str());
  return errors.empty() ? kExitOk : kExitUsage;
}

// `pod-init [--grace S] -- COMMAND...`: tini's job. PID 1 of a container's
// namespace inherits its orphans anyway; elsewhere a subreaper gets them.
int run_wrapper(const std::vector<std::string>& args) {
  pod_init::SupervisorOptions options;
  std::vector<int> success_codes;  // -e: statuses that count as 0
  size_t i = 0;
  for (; i < args.size() && args[i] != "--"; ++i) {
    const std::string* value = i + 1 < args.size() ? &args[i + 1] : nullptr;
    if (args[i] == "--grace") {
      auto seconds = parse_count(value);
      if (!seconds || *seconds > 3600) return usage_error("--grace needs seconds from 0 to 3600");
      options.grace_ms = static_cast<unsigned>(*seconds * 1000);
      ++i;
    } else if (args[i] == "-e") {
      auto code = parse_count(value);
      if (!code || *code > 255) return usage_error("-e needs an exit status from 0 to 255");
      success_codes.push_back(static_cast<int>(*code));
      ++i;
    } else if (args[i] == "-g") {
      options.process_group = true;
    } else if (args[i] == "-v") {
      options.verbose = true;
    } else if (args[i] == "--end-with-parent") {
      options.end_with_parent = true;
    } else if (args[i] == "-s") {
      // tini's -s: pod-init is a subreaper whenever it is not PID 1 anyway.
    } else if (args[i] == "-h" || args[i] == "--help") {
      return print_help("");
    } else {
      return usage_error("unknown option '" + args[i] + "'");
    }
  }
  if (i + 1 >= args.size()) return usage_error("no command after --");
  options.command.assign(args.begin() + static_cast<long>(i) + 1, args.end());
  options.log = [](const std::string& line) {
    std::fprintf(stderr, "pod-init: %s\n", line.c_str());
  };
  if (getpid() != 1) {
    if (int rc = pod_init::become_subreaper(); rc < 0) {
      std::fprintf(stderr, "pod-init: cannot become a child subreaper: %s\n",
                   pod_init::errno_text(-rc).c_str());
    }
  }
  return reporting_errors([&] {
    int status = pod_init::supervise(options);
    // PID 1 of a namespace takes its processes along when it exits; a
    // subreaper's orphans would live on, so they end here.
    if (getpid() != 1) {
      int left = pod_init::end_children(options.grace_ms);
      if (left > 0 && options.verbose) {
        options.log("ended " + std::to_string(left) + " processes the command left running");
      }
    }
    bool expected =
        std::find(success_codes.begin(), success_codes.end(), status) != success_codes.end();
    return expected ? kExitOk : status;
  });
}

}  // namespace

int main(int argc, char** argv) {
  if (pod_init::is_machine_init()) pod_init::run_machine_init();
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) return usage_error("missing command");
  std::string command = args.front();
  if (command == "-h" || command == "--help") return print_help(nullptr);
  if (command == "-V" || command == "--version") {
    std::printf("pod-init %s\n", POD_INIT_VERSION);
    return kExitOk;
  }
  if (command.rfind("-", 0) == 0) return run_wrapper(args);
  args.erase(args.begin());
  if (command == "topo") return run_topo(args);
  if (command == "nccl") return run_nccl(args);
  if (command == "read") return run_read(args);
  if (command == "modules") return run_modules(args);
  if (command == "params") return run_params(args);
  return usage_error("unknown command '" + command + "'");
}
