// pod-init-nvml: PID 1's window on NVML, in a process of its own so that a
// vendor library is never loaded into PID 1 (which is static, and whose crash
// would panic the kernel). Prints one line per GPU (format_gpu_state).
//
//   pod-init-nvml [--enable-persistence] [--wait-fabric SECONDS] BDF...
//
// Exit status: 0 every GPU read (and, with --wait-fabric, its fabric ready);
// 1 NVML failed (one line on stderr); 2 usage; 3 a fabric not ready in time.
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/clock.hpp"
#include "common/sysfs.hpp"
#include "init/nvml_session.hpp"

namespace {

constexpr long kMaxWaitSeconds = 3600;
constexpr unsigned kPollMs = 100;

int usage(const std::string& problem) {
  std::fprintf(stderr,
               "pod-init-nvml: %s\nusage: pod-init-nvml [--enable-persistence] "
               "[--wait-fabric SECONDS] BDF...\n",
               problem.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  bool persistence = false;
  long wait_s = -1;
  std::vector<std::string> gpus;
  for (int i = 1; i < argc; ++i) {
    std::string word = argv[i];
    if (word == "--enable-persistence") {
      persistence = true;
    } else if (word == "--wait-fabric" && i + 1 < argc) {
      auto seconds = pod_init::sysfs::parse_int(argv[++i]);
      if (!seconds || *seconds < 0 || *seconds > kMaxWaitSeconds) {
        return usage("--wait-fabric needs 0 to 3600 seconds, not '" + std::string(argv[i]) + "'");
      }
      wait_s = *seconds;
    } else if (pod_init::sysfs::is_bdf(word)) {
      gpus.push_back(word);
    } else {
      return usage("not a PCI address or option: '" + word + "'");
    }
  }
  if (gpus.empty()) return usage("no GPU named");
  pod_init::NvmlSession nvml;
  std::string problem = nvml.open();
  for (size_t i = 0; problem.empty() && persistence && i < gpus.size(); ++i) {
    problem = nvml.enable_persistence(gpus[i]);
  }
  const uint64_t start = pod_init::monotonic_ms();
  std::vector<pod_init::GpuNvmlState> states(gpus.size());
  bool ready = false;
  while (problem.empty()) {
    ready = true;
    for (size_t i = 0; problem.empty() && i < gpus.size(); ++i) {
      problem = nvml.read(gpus[i], &states[i]);
      ready = ready && pod_init::fabric_ready(states[i]);
    }
    if (ready || wait_s < 0 || pod_init::monotonic_ms() - start >= uint64_t(wait_s) * 1000) break;
    usleep(kPollMs * 1000);
  }
  if (!problem.empty()) {
    std::fprintf(stderr, "pod-init-nvml: %s\n", problem.c_str());
    return 1;
  }
  for (const pod_init::GpuNvmlState& state : states) {
    std::printf("%s\n", pod_init::format_gpu_state(state).c_str());
  }
  std::printf("waited_ms %llu\n",
              static_cast<unsigned long long>(pod_init::monotonic_ms() - start));
  return wait_s >= 0 && !ready ? 3 : 0;
}
