// pod-init: the node runtime's executable. As the machine's init (PID 1 from
// the boot image) it brings the node up and runs the workload; otherwise
// `pod-init [--grace S] -- COMMAND...` supervises a command as tini does, and
// subcommands inspect the node.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

#include "common/clock.hpp"
#include "common/command_line.hpp"
#include "common/error.hpp"
#include "common/sha256.hpp"
#include "common/sysfs.hpp"
#include "init/init_config.hpp"
#include "init/kernel_modules.hpp"
#include "init/machine_init.hpp"
#include "init/nvidia_bringup.hpp"
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

int run_wrapper(const pod_init::ParsedCommand& args);
int run_topo(const pod_init::ParsedCommand& args);
int run_nccl(const pod_init::ParsedCommand& args);
int run_read(const pod_init::ParsedCommand& args);
int run_modules(const pod_init::ParsedCommand& args);
int run_params(const pod_init::ParsedCommand& args);
int run_bringup(const pod_init::ParsedCommand& args);

struct Command {
  pod_init::CommandSpec spec;
  int (*run)(const pod_init::ParsedCommand&);
};

constexpr int64_t kMaxGraceSeconds = 3600;

// Every command, its options and their ranges: the parser, the usage lines
// and --help are all made from this table.
const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      {{"",
        "-- COMMAND [ARGS...]",
        {{"--grace", "SECONDS", "before KILL, after TERM or INT (default 10)", "seconds", 0,
          kMaxGraceSeconds},
         {"-g", nullptr, "a process group of its own; signals go to the group"},
         {"-e", "CODE", "this status counts as 0 (repeatable)", "an exit status", 0, 255, true},
         {"-v", nullptr, "a line per signal forwarded and process reaped"},
         {"-s", nullptr, "tini's -s: pod-init is a subreaper unless PID 1"},
         {"--end-with-parent", nullptr, "if our starter dies (even KILLed), KILL all, exit 137"}},
        "Runs COMMAND as a child, as tini does: forwards TERM, INT, HUP, USR1, USR2,\n"
        "QUIT, WINCH; reaps every process (a child subreaper when not PID 1); when the\n"
        "command has ended, what it left running gets TERM and, after the grace, KILL.\n"
        "As PID 1 of the machine (the boot image's /init) pod-init reads podinit.* from\n"
        "the kernel command line instead; see docs/pod-init.md.\n",
        true},
       run_wrapper},
      {{"topo",
        "",
        {{"--sysfs-root", "DIR", "the sysfs tree to read (default /sys)"},
         {"--json", nullptr, "one JSON document"},
         {"--expect-gpus", "N", "an error finding for fewer GPUs", "a whole number", 0,
          pod_init::kMaxExpectedGpus},
         {"--no-bar0", nullptr, "do not map GPU BAR0"}},
        "PCIe topology of this node: GPU/NIC/NVMe matrix, links, BARs, findings.\n"},
       run_topo},
      {{"nccl",
        "",
        {{"--sysfs-root", "DIR", "the sysfs tree to read (default /sys)"},
         {"--hints", "FILE", "regroup devices under switches/NUMA nodes"},
         {"--hostfile", "FILE", "one IP address per node, node 0 first"},
         {"--node", "K", "write node K's files: a plan for a cluster", "a node index", 0,
          static_cast<int64_t>(pod_init::kMaxHosts) - 1},
         {"--out", "DIR", "where the files go (default .)"},
         {"--force-rings", nullptr, "make NCCL use the computed rings unchecked"},
         {"--socket-ifname", "NAME", "NCCL's socket interface (default: toward node 0)"},
         {"--channels", "N", "ring channels (default: by bandwidth)", "a whole number", 1,
          pod_init::kMaxChannels},
         {"--proc-root", "DIR", "the proc tree to read (default /proc)"}},
        "NCCL configuration: writes nccl-topo.xml, nccl-graph.xml, nccl.env (and hosts\n"
        "with --hostfile) and prints the rings. --node K plans node K of a cluster of\n"
        "such nodes.\n"},
       run_nccl},
      {{"read",
        "PATH",
        {{"--offset", "BYTES", "where to start (default 0)", "a byte count", 0, INT64_MAX},
         {"--length", "BYTES", "how much (default: to the end)", "a byte count", 0, INT64_MAX},
         {"--queue-depth", "N", "reads in flight (default 32)", "a whole number", 1,
          pod_init::kMaxQueueDepth}},
        "Reads PATH (a file or block device) with the O_DIRECT reader and prints the\n"
        "SHA-256 of the bytes read.\n"},
       run_read},
      {{"modules",
        "NAME...",
        {{"--release-dir", "DIR", "modules.dep's folder (default /lib/modules/$(uname -r))"}},
        "The modules.dep lines of NAME... and of everything they need, dependencies\n"
        "first: what PID 1 loads for podinit.modules, and what initramfs/build puts in\n"
        "the image.\n"},
       run_modules},
      {{"params",
        "LINE...",
        {},
        "Checks podinit.KEY=VALUE lines as PID 1 reads /etc/pod-init.conf: one line per\n"
        "problem (initramfs/build runs it).\n"},
       run_params},
      {{"bringup",
        "",
        {{"--dry-run", nullptr, "change nothing: see and read only (required)"},
         {"--sysfs-root", "DIR", "the sysfs tree to scan (default /sys)"},
         {"--release-dir", "DIR", "modules.dep's folder (default /lib/modules/$(uname -r))"},
         {"--helper", "PATH", "pod-init-nvml (default: beside this pod-init)"},
         {"--deadline", "SECONDS", "for the GPUs and the fabric (default 120)", "seconds", 1,
          3600}},
        "PID 1's NVIDIA bring-up on a running node, changing nothing: which driver\n"
        "modules are loaded, the GPUs bound, the device nodes, each GPU's persistence\n"
        "and fabric state through NVML, and each step's time. Exits 1 when a step\n"
        "would stop the boot.\n"},
       run_bringup},
  };
  return table;
}

const Command* find_command(const std::string& name) {
  for (const Command& command : commands()) {
    if (name == command.spec.name) return &command;
  }
  return nullptr;
}

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
std::string usage_lines(const Command* command) {
  std::string usage;
  for (const Command& entry : commands()) {
    if (command != nullptr && command != &entry) continue;
    usage += (usage.empty() ? "usage: " : "       ") + pod_init::usage_line("pod-init", entry.spec);
  }
  return command == nullptr ? usage + "       pod-init --version\n" : usage;
}

// Usage, what the command does and its options, then the exit-status table.
int print_help(const Command* command) {
  std::string text = usage_lines(command);
  for (const Command& entry : commands()) {
    if (command != nullptr && command != &entry) continue;
    text += "\n";
    if (command == nullptr) text += *entry.spec.name ? entry.spec.name : "-- COMMAND";
    text += (command == nullptr ? ":\n" : "") + pod_init::option_help(entry.spec);
  }
  std::fputs((text + "\n" + kExitStatus).c_str(), stdout);
  return kExitOk;
}

int usage_error(const std::string& message, const Command* command = nullptr) {
  std::fprintf(stderr, "pod-init: %s\n%s", message.c_str(), usage_lines(command).c_str());
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

int run_topo(const pod_init::ParsedCommand& args) {
  pod_init::ScanOptions options;
  options.sysfs_root = args.text("--sysfs-root", options.sysfs_root);
  options.expect_gpus = static_cast<int>(args.number("--expect-gpus", -1));
  options.probe_bar0 = !args.has("--no-bar0");
  const bool json = args.has("--json");
  return reporting_errors([&] {
    pod_init::Topology topo = pod_init::scan(options);
    std::string out = json ? pod_init::topology_json(topo) : pod_init::topology_text(topo);
    std::fwrite(out.data(), 1, out.size(), stdout);
    return pod_init::has_errors(topo.findings) ? kExitFindings : kExitOk;
  });
}

int run_nccl(const pod_init::ParsedCommand& args) {
  return reporting_errors([&] {
    pod_init::NcclRequest request = pod_init::make_nccl_request(
        pod_init::scan({args.text("--sysfs-root", "/sys"), -1, false}),
        {args.text("--hints"), args.text("--proc-root", "/proc"), pod_init::process_environment()});
    request.nodes = pod_init::load_node_list(args.text("--hostfile"), "",
                                             static_cast<int>(args.number("--node", -1)));
    request.out_dir = args.text("--out", request.out_dir);
    request.socket_ifname = args.text("--socket-ifname");
    request.force_rings = args.has("--force-rings");
    request.channels = static_cast<int>(args.number("--channels", request.channels));
    pod_init::NcclConfig config = pod_init::build_nccl_config(request);
    pod_init::write_nccl_files(config);
    std::string out = pod_init::nccl_summary(config);
    std::fwrite(out.data(), 1, out.size(), stdout);
    return kExitOk;
  });
}

int run_read(const pod_init::ParsedCommand& args) {
  if (args.operands.size() != 1) return usage_error("read needs one PATH", find_command("read"));
  const std::string& path = args.operands[0];
  const uint64_t offset = static_cast<uint64_t>(args.number("--offset", 0));
  uint64_t length = static_cast<uint64_t>(args.number("--length", INT64_MAX));
  const int64_t depth = args.number("--queue-depth", 32);
  return reporting_errors([&] {
    pod_init::DirectReader reader(path, depth, pod_init::BackendChoice::Auto);
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

int run_modules(const pod_init::ParsedCommand& args) {
  const std::vector<std::string>& names = args.operands;
  if (names.empty())
    return usage_error("modules needs at least one module NAME", find_command("modules"));
  const std::string release_dir = args.text("--release-dir", pod_init::running_release_dir());
  return reporting_errors([&] {
    for (const std::string& line : pod_init::module_dep_lines(release_dir, names)) {
      std::printf("%s\n", line.c_str());
    }
    return kExitOk;
  });
}

int run_params(const pod_init::ParsedCommand& args) {
  pod_init::InitConfig config;
  std::vector<std::string> errors;
  // Each LINE is checked as PID 1 reads /etc/pod-init.conf; a problem names the argument.
  for (size_t i = 0; i < args.operands.size(); ++i) {
    pod_init::apply_init_line(args.operands[i], "argument " + std::to_string(i + 1), &config,
                              &errors);
  }
  for (const std::string& error : errors) std::fprintf(stderr, "pod-init: %s\n", error.c_str());
  return errors.empty() ? kExitOk : kExitUsage;
}

int run_bringup(const pod_init::ParsedCommand& args) {
  if (!args.has("--dry-run")) {
    return usage_error("bringup runs only with --dry-run: PID 1 does it for real",
                       find_command("bringup"));
  }
  pod_init::NvidiaBringupOptions options;
  options.dry_run = true;
  options.private_mounts = false;
  options.deadline_s = static_cast<unsigned>(args.number("--deadline", options.deadline_s));
  options.release_dir = args.text("--release-dir", pod_init::running_release_dir());
  std::string self;
  pod_init::sysfs::resolve("/proc/self/exe", &self);
  options.helper = args.text("--helper", self.substr(0, self.rfind('/') + 1) + "pod-init-nvml");
  options.log = [](const std::string& line) { std::printf("%s\n", line.c_str()); };
  return reporting_errors([&] {
    pod_init::Topology topo = pod_init::scan({args.text("--sysfs-root", "/sys"), -1, false});
    pod_init::NvidiaHardware hardware = pod_init::find_nvidia_hardware(topo);
    if (hardware.gpus.empty() && hardware.nvswitches.empty()) {
      std::printf("nvidia: no NVIDIA GPU or NVSwitch here: nothing to bring up\n");
      return kExitOk;
    }
    pod_init::NvidiaBringup bringup(options);
    try {
      bringup.start(hardware);
      bringup.finish();
    } catch (const pod_init::SysError&) {
      throw;
    } catch (const std::runtime_error& e) {  // a step that would stop the boot
      std::fprintf(stderr, "pod-init: %s\n", e.what());
      return kExitFindings;
    }
    std::vector<pod_init::BootPhase> phases = bringup.phases();
    phases.push_back(bringup.lock_modules());
    for (const pod_init::BootPhase& phase : phases) {
      std::printf("phase %-16s %9.3f s\n", phase.phase.c_str(), phase.seconds);
    }
    return kExitOk;
  });
}

// `pod-init [--grace S] -- COMMAND...`: tini's job. PID 1 of a container's
// namespace inherits its orphans anyway; elsewhere a subreaper gets them.
int run_wrapper(const pod_init::ParsedCommand& args) {
  if (args.operands.empty()) return usage_error("no command after --", find_command(""));
  pod_init::SupervisorOptions options;
  options.command = args.operands;
  options.grace_ms = static_cast<unsigned>(args.number("--grace", options.grace_ms / 1000) * 1000);
  options.process_group = args.has("-g");
  options.verbose = args.has("-v");
  options.end_with_parent = args.has("--end-with-parent");
  const std::vector<int64_t> success_codes = args.numbers("-e");  // statuses that count as 0
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
  if (args[0] == "-h" || args[0] == "--help") return print_help(nullptr);
  if (args[0] == "-V" || args[0] == "--version") {
    std::printf("pod-init %s\n", POD_INIT_VERSION);
    return kExitOk;
  }
  // An option first: the supervisor's command line (pod-init [OPTIONS] -- COMMAND).
  const bool supervising = args[0].rfind("-", 0) == 0;
  const Command* command = find_command(supervising ? "" : args[0]);
  if (command == nullptr) return usage_error("unknown command '" + args[0] + "'");
  if (!supervising) args.erase(args.begin());
  std::string error;
  std::optional<pod_init::ParsedCommand> parsed =
      pod_init::parse_command(command->spec, args, &error);
  if (!parsed) return usage_error(error, command);
  if (parsed->help) return print_help(command);
  return command->run(*parsed);
}
