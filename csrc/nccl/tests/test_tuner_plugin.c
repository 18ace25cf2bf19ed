/* Loads pod-init's tuner plugin the way NCCL does (dlopen, dlsym
 * "ncclTunerPlugin_v5", through the interface header only) and checks its
 * answers: the table's choices inside its ranges, NCCL's own everywhere
 * else, and NCCL's own for a stale, malformed or missing table.
 *
 * Usage: test_tuner_plugin PLUGIN.so */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nccl/tuner/nccl_tuner_abi.h"

static int failures = 0;
#define CHECK(cond)                                                     \
  do {                                                                  \
    if (!(cond)) {                                                      \
      fprintf(stderr, "%s:%d: %s failed\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                       \
    }                                                                   \
  } while (0)

/* NCCL's version as this "NCCL" reports it; the plugin finds this symbol in
 * the global scope, as it finds the real one. */
static int nccl_version_code = 22809;
__attribute__((visibility("default"))) int ncclGetVersion(int* version) {
  *version = nccl_version_code;
  return 0;
}

static char last_log[1024];
static int last_level;
static void logger(int level, unsigned long flags, const char* file, int line, const char* fmt,
                   ...) {
  (void)flags, (void)file, (void)line;
  va_list args;
  va_start(args, fmt);
  vsnprintf(last_log, sizeof last_log, fmt, args);
  va_end(args);
  last_level = level;
}

static char dir[] = "/tmp/pod-init-tuner-XXXXXX";

static const char* write_table(const char* name, const char* text) {
  static char path[256];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE* f = fopen(path, "w");
  if (f == NULL || fputs(text, f) < 0 || fclose(f) != 0) {
    perror(path);
    exit(1);
  }
  return path;
}

#define A POD_INIT_NCCL_NUM_ALGORITHMS
#define P POD_INIT_NCCL_NUM_PROTOCOLS

/* NCCL's cost table for a call where Tree/LL128 cannot run. */
static void fill_costs(float costs[A][P]) {
  for (int a = 0; a < A; ++a)
    for (int p = 0; p < P; ++p) costs[a][p] = 10.0f + (float)(a * P + p);
  costs[POD_INIT_NCCL_ALGO_TREE][POD_INIT_NCCL_PROTO_LL128] = POD_INIT_NCCL_COST_UNAVAILABLE;
}

/* One getCollInfo call; returns the (algorithm*P + protocol) the plugin made
 * cheapest (-1: it changed no cost) and sets *channels. */
static int ask(ncclTuner_v5_t* tuner, void* ctx, ncclFunc_t coll, size_t bytes, int* channels) {
  float costs[A][P];
  fill_costs(costs);
  *channels = 0;
  CHECK(tuner->getCollInfo(ctx, coll, bytes, 1, (float**)costs, A, P, 0, channels) == ncclSuccess);
  for (int a = 0; a < A; ++a)
    for (int p = 0; p < P; ++p)
      if (costs[a][p] == 0.0f) return a * P + p;
  return -1;
}

static void* start(ncclTuner_v5_t* tuner, const char* table, size_t ranks, size_t nodes) {
  if (table)
    setenv("POD_INIT_NCCL_TUNING", table, 1);
  else
    unsetenv("POD_INIT_NCCL_TUNING");
  last_log[0] = '\0';
  void* ctx = NULL;
  CHECK(tuner->init(&ctx, 42, ranks, nodes, logger, NULL, NULL) == ncclSuccess);
  CHECK(ctx != NULL);
  return ctx;
}

static const char* kTable =
    "{\"format\": 1, \"key\": {\"nccl_version\": \"2.28.9\"}, \"ranks\": 2, \"nodes\": 1,\n"
    " \"rules\": [\n"
    "  {\"collective\": \"allreduce\", \"min_bytes\": 67108864, \"max_bytes\": 8589934592,\n"
    "   \"algorithm\": \"ring\", \"protocol\": \"simple\", \"channels\": 32},\n"
    "  {\"collective\": \"allreduce\", \"min_bytes\": 65536, \"max_bytes\": 1048576,\n"
    "   \"algorithm\": \"tree\", \"protocol\": \"ll\", \"channels\": 8},\n"
    "  {\"collective\": \"reducescatter\", \"min_bytes\": 1024, \"max_bytes\": 2048,\n"
    "   \"algorithm\": \"tree\", \"protocol\": \"ll128\"},\n"
    "  {\"collective\": \"allgather\", \"min_bytes\": 4096, \"max_bytes\": 8192, \"channels\": 4}\n"
    " ]}\n";

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s PLUGIN.so\n", argv[0]);
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "%s\n", dlerror());
    return 1;
  }
  ncclTuner_v5_t* tuner = (ncclTuner_v5_t*)dlsym(lib, "ncclTunerPlugin_v5");
  CHECK(tuner != NULL && strcmp(tuner->name, "pod-init") == 0);
  if (mkdtemp(dir) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  const int ring_simple = POD_INIT_NCCL_ALGO_RING * P + POD_INIT_NCCL_PROTO_SIMPLE;
  const int tree_ll = POD_INIT_NCCL_ALGO_TREE * P + POD_INIT_NCCL_PROTO_LL;
  int channels;

  /* The table's choices inside its ranges (both ends included), NCCL's outside. */
  void* ctx = start(tuner, write_table("good.json", kTable), 2, 1);
  CHECK(strstr(last_log, "4 rules for NCCL 2.28.9") != NULL);
  CHECK(ask(tuner, ctx, ncclFuncAllReduce, 67108864, &channels) == ring_simple && channels == 32);
  CHECK(ask(tuner, ctx, ncclFuncAllReduce, 8589934592ULL, &channels) == ring_simple);
  CHECK(ask(tuner, ctx, ncclFuncAllReduce, 65536, &channels) == tree_ll && channels == 8);
  CHECK(ask(tuner, ctx, ncclFuncAllReduce, 8, &channels) == -1 && channels == 0);
  CHECK(ask(tuner, ctx, ncclFuncAllReduce, 2097152, &channels) == -1 && channels == 0);
  CHECK(ask(tuner, ctx, ncclFuncAllReduce, 8589934593ULL, &channels) == -1 && channels == 0);
  CHECK(ask(tuner, ctx, ncclFuncBroadcast, 67108864, &channels) == -1 && channels == 0);
  /* A pair NCCL cannot run for this call stays NCCL's to choose. */
  CHECK(ask(tuner, ctx, ncclFuncReduceScatter, 1024, &channels) == -1 && channels == 0);
  /* Channels alone. */
  CHECK(ask(tuner, ctx, ncclFuncAllGather, 4096, &channels) == -1 && channels == 4);
  /* Switched off (a benchmark's default side) and on again. */
  void (*use_table)(int) = (void (*)(int))dlsym(lib, "pod_init_tuner_use_table");
  CHECK(use_table != NULL);
  use_table(0);
  CHECK(ask(tuner, ctx, ncclFuncAllReduce, 67108864, &channels) == -1 && channels == 0);
  use_table(1);
  CHECK(ask(tuner, ctx, ncclFuncAllReduce, 67108864, &channels) == ring_simple && channels == 32);
  CHECK(tuner->finalize(ctx) == ncclSuccess);

  /* Another NCCL than the table's: refused, said as a warning. */
  nccl_version_code = 22703;
  ctx = start(tuner, write_table("good.json", kTable), 2, 1);
  CHECK(last_level == POD_INIT_NCCL_LOG_WARN);
  CHECK(strstr(last_log, "measured with NCCL 2.28.9, this is NCCL 2.27.3") != NULL);
  CHECK(ask(tuner, ctx, ncclFuncAllReduce, 67108864, &channels) == -1 && channels == 0);
  CHECK(tuner->finalize(ctx) == ncclSuccess);
  nccl_version_code = 22809;

  /* A communicator of another shape (a sub-group): NCCL's own, said as info. */
  ctx = start(tuner, write_table("good.json", kTable), 4, 1);
  CHECK(last_level == POD_INIT_NCCL_LOG_INFO && strstr(last_log, "is for 2 ranks") != NULL);
  CHECK(ask(tuner, ctx, ncclFuncAllReduce, 67108864, &channels) == -1 && channels == 0);
  CHECK(tuner->finalize(ctx) == ncclSuccess);

  /* Malformed, missing, unset: NCCL's own, the file and the reason named. */
  const char* bad = write_table(
      "bad.json",
      "{\"format\": 1, \"key\": {\"nccl_version\": \"2.28.9\"}, \"ranks\": 2, \"nodes\": 1,\n"
      " \"rules\": [{\"collective\": \"allreduce\", \"min_bytes\": 0, \"max_bytes\": 10,\n"
      "             \"algorithm\": \"spiral\", \"protocol\": \"ll\"}]}\n");
  ctx = start(tuner, bad, 2, 1);
  CHECK(last_level == POD_INIT_NCCL_LOG_WARN && strstr(last_log, "bad.json") != NULL &&
        strstr(last_log, "unknown algorithm 'spiral'") != NULL);
  CHECK(ask(tuner, ctx, ncclFuncAllReduce, 8, &channels) == -1);
  CHECK(tuner->finalize(ctx) == ncclSuccess);
  const char* overlap = write_table(
      "overlap.json",
      "{\"format\": 1, \"key\": {\"nccl_version\": \"2.28.9\"}, \"ranks\": 2, \"nodes\": 1,\n"
      " \"rules\": [{\"collective\": \"allreduce\", \"min_bytes\": 0, \"max_bytes\": 10},\n"
      "           {\"collective\": \"allreduce\", \"min_bytes\": 10, \"max_bytes\": 20}]}\n");
  ctx = start(tuner, overlap, 2, 1);
  CHECK(strstr(last_log, "allreduce ranges overlap at 10 bytes") != NULL);
  CHECK(tuner->finalize(ctx) == ncclSuccess);
  /* ranks read as 64-bit and bounded: 4294967298 once wrapped to 2 and was used. */
  const char* wrapped = write_table(
      "wrapped.json",
      "{\"format\": 1, \"key\": {\"nccl_version\": \"2.28.9\"}, \"ranks\": 4294967298,\n"
      " \"nodes\": 1, \"rules\": [{\"collective\": \"allreduce\", \"min_bytes\": 0,\n"
      "             \"max_bytes\": 10, \"channels\": 4}]}\n");
  ctx = start(tuner, wrapped, 2, 1);
  CHECK(last_level == POD_INIT_NCCL_LOG_WARN && strstr(last_log, "ranks must be from 1") != NULL);
  CHECK(ask(tuner, ctx, ncclFuncAllReduce, 8, &channels) == -1 && channels == 0);
  CHECK(tuner->finalize(ctx) == ncclSuccess);
  /* A large table answers by search, not scan: every rule of 100,000 is found. */
  {
    static char big[100000 * 96 + 256];
    size_t at = (size_t)snprintf(big, sizeof big,
                                 "{\"format\": 1, \"key\": {\"nccl_version\": \"2.28.9\"}, "
                                 "\"ranks\": 2, \"nodes\": 1, \"rules\": [");
    for (int i = 0; i < 100000; ++i) {
      at += (size_t)snprintf(big + at, sizeof big - at,
                             "%s{\"collective\": \"allgather\", \"min_bytes\": %d, "
                             "\"max_bytes\": %d, \"channels\": %d}",
                             i ? "," : "", i * 10, i * 10 + 4, 1 + i % 64);
    }
    snprintf(big + at, sizeof big - at, "]}\n");
    ctx = start(tuner, write_table("big.json", big), 2, 1);
    CHECK(strstr(last_log, "100000 rules") != NULL);
    for (int i = 0; i < 100000; i += 997) {
      CHECK(ask(tuner, ctx, ncclFuncAllGather, (size_t)i * 10 + 4, &channels) == -1 &&
            channels == 1 + i % 64);
      CHECK(ask(tuner, ctx, ncclFuncAllGather, (size_t)i * 10 + 5, &channels) == -1 &&
            channels == 0);
    }
    CHECK(tuner->finalize(ctx) == ncclSuccess);
  }
  /* A FIFO is refused at once (it once blocked NCCL's init until a writer came). */
  char fifo[300];
  snprintf(fifo, sizeof fifo, "%s/fifo.json", dir);
  CHECK(mkfifo(fifo, 0600) == 0);
  ctx = start(tuner, fifo, 2, 1);
  CHECK(last_level == POD_INIT_NCCL_LOG_WARN && strstr(last_log, "not a regular file") != NULL);
  CHECK(tuner->finalize(ctx) == ncclSuccess);
  unlink(fifo);
  char missing[300];
  snprintf(missing, sizeof missing, "%s/missing.json", dir);
  ctx = start(tuner, missing, 2, 1);
  CHECK(last_level == POD_INIT_NCCL_LOG_WARN &&
        strstr(last_log, "missing.json: No such file") != NULL);
  CHECK(tuner->finalize(ctx) == ncclSuccess);
  ctx = start(tuner, NULL, 2, 1);
  CHECK(strstr(last_log, "POD_INIT_NCCL_TUNING is not set") != NULL);
  CHECK(ask(tuner, ctx, ncclFuncAllReduce, 67108864, &channels) == -1);

  /* Forcing (what --tune measures with) wins over everything until cleared,
   * and counts the calls whose pair NCCL could not run. */
  void (*force)(int, int, int) = (void (*)(int, int, int))dlsym(lib, "pod_init_tuner_force");
  long (*unavailable)(void) = (long (*)(void))dlsym(lib, "pod_init_tuner_unavailable");
  CHECK(force != NULL && unavailable != NULL);
  force(POD_INIT_NCCL_ALGO_TREE, POD_INIT_NCCL_PROTO_LL, 3);
  CHECK(ask(tuner, ctx, ncclFuncAllReduce, 8, &channels) == tree_ll && channels == 3);
  CHECK(unavailable() == 0);
  force(POD_INIT_NCCL_ALGO_TREE, POD_INIT_NCCL_PROTO_LL128, 0);
  CHECK(ask(tuner, ctx, ncclFuncAllReduce, 8, &channels) == -1 && unavailable() == 1);
  force(-1, -1, 0);
  CHECK(ask(tuner, ctx, ncclFuncAllReduce, 8, &channels) == -1 && channels == 0);
  CHECK(unavailable() == 0);
  CHECK(tuner->finalize(ctx) == ncclSuccess);

  /* Every table the checks wrote, whichever they were. */
  DIR* tables = opendir(dir);
  for (struct dirent* entry; tables != NULL && (entry = readdir(tables)) != NULL;)
    if (entry->d_name[0] != '.') unlinkat(dirfd(tables), entry->d_name, 0);
  if (tables != NULL) closedir(tables);
  CHECK(rmdir(dir) == 0);
  if (failures) fprintf(stderr, "%d checks failed\n", failures);
  return failures ? 1 : 0;
}
