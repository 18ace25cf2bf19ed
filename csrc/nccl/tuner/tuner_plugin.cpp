// pod-init's NCCL tuner plugin: NCCL loads it (NCCL_TUNER_PLUGIN=<this .so>)
// and asks it, per collective call, which algorithm, protocol and channel
// count to use. It answers from the table in $POD_INIT_NCCL_TUNING when that
// table was measured with this NCCL on a communicator of this shape, and
// otherwise leaves every choice to NCCL, saying why once in NCCL's log.
//
// It never fails NCCL: a missing, unreadable or stale table is a log line,
// not an error, because an error from init would fail the communicator.
#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <optional>
#include <string>

#include "common/error.hpp"
#include "common/line_input.hpp"
#include "nccl/tuner/nccl_tuner_abi.h"
#include "nccl/tuner/tuning_table.hpp"

namespace pod_init {
namespace {

constexpr const char* kTableEnv = "POD_INIT_NCCL_TUNING";
constexpr size_t kMaxTableBytes = 16 << 20;

struct TunerContext {
  ncclDebugLogger_t log = nullptr;
  std::optional<TuningTable> table;  // empty: NCCL decides everything
};

// What a measurement run forces on every call, over any table (see
// pod_init_tuner_force below). Plain atomics: NCCL may enqueue from any thread.
std::atomic<int> forced_algorithm{-1};
std::atomic<int> forced_protocol{-1};
std::atomic<int> forced_channels{0};
std::atomic<long> forced_unavailable{0};
// Off: the table is ignored (a benchmark's "NCCL's default" side).
std::atomic<bool> table_enabled{true};

template <typename... Args>
void log_line(ncclDebugLogger_t log, int level, const char* fmt, Args... args) {
  if (log != nullptr) {
    log(level, POD_INIT_NCCL_SUBSYS_INIT | POD_INIT_NCCL_SUBSYS_TUNING, __FILE__, __LINE__, fmt,
        args...);
  }
}

// The version of the NCCL that loaded us. Its ncclGetVersion is found in the
// global scope, or else in the library that holds NCCL's logger (the one NCCL
// handed us), which is NCCL itself even when it was loaded privately.
std::optional<int> loaded_nccl_version(ncclDebugLogger_t log) {
  using GetVersion = int (*)(int*);
  auto get = reinterpret_cast<GetVersion>(dlsym(RTLD_DEFAULT, "ncclGetVersion"));
  Dl_info info{};
  if (get == nullptr && log != nullptr && dladdr(reinterpret_cast<void*>(log), &info) != 0 &&
      info.dli_fname != nullptr) {
    if (void* nccl = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD)) {
      get = reinterpret_cast<GetVersion>(dlsym(nccl, "ncclGetVersion"));
      dlclose(nccl);  // RTLD_NOLOAD took a reference; NCCL keeps its own
    }
  }
  int code = 0;
  if (get == nullptr || get(&code) != 0) return std::nullopt;
  return code;
}

// The table, or nullopt after logging why it is not used.
std::optional<TuningTable> usable_table(ncclDebugLogger_t log, size_t ranks, size_t nodes) {
  const char* path = getenv(kTableEnv);
  if (path == nullptr || *path == '\0') {
    log_line(log, POD_INIT_NCCL_LOG_INFO, "pod-init tuner: %s is not set; NCCL's own choices",
             kTableEnv);
    return std::nullopt;
  }
  std::string text;
  // A table is a few KiB; the bound only keeps a wrong path from reading a disk.
  if (int rc = read_input_file(path, &text, kMaxTableBytes); rc < 0) {
    log_line(log, POD_INIT_NCCL_LOG_WARN, "pod-init tuner: %s: %s; NCCL's own choices", path,
             rc == -EINVAL ? "not a regular file" : errno_text(-rc).c_str());
    return std::nullopt;
  }
  TuningTable table;
  try {
    table = parse_tuning_table(text, path);
  } catch (const InputError& e) {
    log_line(log, POD_INIT_NCCL_LOG_WARN, "pod-init tuner: %s; NCCL's own choices", e.what());
    return std::nullopt;
  }
  const std::optional<int> code = loaded_nccl_version(log);
  if (!code) {
    log_line(log, POD_INIT_NCCL_LOG_WARN,
             "pod-init tuner: %s: cannot ask NCCL its version (no ncclGetVersion); "
             "NCCL's own choices",
             path);
    return std::nullopt;
  }
  const std::string running = nccl_version_text(*code);
  if (running != table.nccl_version) {
    log_line(log, POD_INIT_NCCL_LOG_WARN,
             "pod-init tuner: %s was measured with NCCL %s, this is NCCL %s; "
             "NCCL's own choices (run pyinit nccl --tune again)",
             path, table.nccl_version.c_str(), running.c_str());
    return std::nullopt;
  }
  if (static_cast<size_t>(table.ranks) != ranks || static_cast<size_t>(table.nodes) != nodes) {
    // A sub-communicator (a tensor- or pipeline-parallel group) is normal, not an error.
    log_line(log, POD_INIT_NCCL_LOG_INFO,
             "pod-init tuner: %s is for %d ranks on %d nodes, this communicator has %zu on %zu; "
             "NCCL's own choices for it",
             path, table.ranks, table.nodes, ranks, nodes);
    return std::nullopt;
  }
  log_line(log, POD_INIT_NCCL_LOG_INFO, "pod-init tuner: %s: %zu rules for NCCL %s, %d ranks", path,
           table.rules.size(), running.c_str(), table.ranks);
  return table;
}

// Makes (algorithm, protocol) NCCL's cheapest entry and sets the channels.
// Returns false, changing nothing, when NCCL cannot run that pair for this call.
bool apply(const TunerChoice& choice, float** cost_table, int algorithms, int protocols,
           int* channels) {
  if (choice.algorithm >= 0) {
    if (choice.algorithm >= algorithms || choice.protocol >= protocols) return false;
    // The table is float[algorithms][protocols] behind a float**.
    float* cost =
        reinterpret_cast<float*>(cost_table) + choice.algorithm * protocols + choice.protocol;
    if (*cost == POD_INIT_NCCL_COST_UNAVAILABLE) return false;
    *cost = 0.0f;
  }
  if (choice.channels > 0) *channels = choice.channels;
  return true;
}

ncclResult_t tuner_init(void** context, uint64_t /*comm_id*/, size_t ranks, size_t nodes,
                        ncclDebugLogger_t log, ncclNvlDomainInfo_v5_t* /*nvl_domains*/,
                        ncclTunerConstants_v5_t* /*constants*/) {
  auto* ctx = new (std::nothrow) TunerContext;
  if (ctx == nullptr) return ncclSystemError;
  ctx->log = log;
  try {
    ctx->table = usable_table(log, ranks, nodes);
  } catch (const std::exception& e) {
    // Out of memory or a failed read half-way: still NCCL's own choices.
    log_line(log, POD_INIT_NCCL_LOG_WARN, "pod-init tuner: %s; NCCL's own choices", e.what());
  }
  *context = ctx;
  return ncclSuccess;
}

ncclResult_t tuner_get_coll_info(void* context, ncclFunc_t collective, size_t bytes,
                                 int /*pipe_ops*/, float** cost_table, int algorithms,
                                 int protocols, int /*registered*/, int* channels) {
  const TunerChoice forced{forced_algorithm.load(std::memory_order_relaxed),
                           forced_protocol.load(std::memory_order_relaxed),
                           forced_channels.load(std::memory_order_relaxed)};
  if (forced.algorithm >= 0 || forced.channels > 0) {
    if (!apply(forced, cost_table, algorithms, protocols, channels)) {
      forced_unavailable.fetch_add(1, std::memory_order_relaxed);
    }
    return ncclSuccess;
  }
  const auto* ctx = static_cast<const TunerContext*>(context);
  if (ctx->table && table_enabled.load(std::memory_order_relaxed)) {
    if (const TunerRule* rule = find_tuner_rule(*ctx->table, collective, bytes)) {
      apply(rule->choice, cost_table, algorithms, protocols, channels);
    }
  }
  return ncclSuccess;
}

ncclResult_t tuner_finalize(void* context) {
  delete static_cast<TunerContext*>(context);
  return ncclSuccess;
}

}  // namespace
}  // namespace pod_init

extern "C" {

__attribute__((visibility("default"))) ncclTuner_v5_t ncclTunerPlugin_v5 = {
    "pod-init", pod_init::tuner_init, pod_init::tuner_get_coll_info, pod_init::tuner_finalize};

// For `pyinit nccl --tune`, which loads this library into its measuring ranks
// before NCCL does (the same file: one copy): every call until the next
// force uses this algorithm/protocol (-1: NCCL's) and channel count (0:
// NCCL's). All ranks must force the same choice before the same call.
__attribute__((visibility("default"))) void pod_init_tuner_force(int algorithm, int protocol,
                                                                 int channels) {
  pod_init::forced_algorithm.store(algorithm);
  pod_init::forced_protocol.store(protocol);
  pod_init::forced_channels.store(channels);
  pod_init::forced_unavailable.store(0);
}

// For `pyinit bench ... --tuning`, which times NCCL's default and the table
// in turns in one process: 0 makes every following call NCCL's own choice.
__attribute__((visibility("default"))) void pod_init_tuner_use_table(int enabled) {
  pod_init::table_enabled.store(enabled != 0);
}

// How many calls since the last force NCCL could not run the forced pair for
// (the measurement of that candidate is then NCCL's choice, not the candidate).
__attribute__((visibility("default"))) long pod_init_tuner_unavailable(void) {
  return pod_init::forced_unavailable.load();
}

}  // extern "C"
