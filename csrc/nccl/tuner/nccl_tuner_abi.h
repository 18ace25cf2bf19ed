/* NCCL's tuner plugin interface, version 5, as NCCL 2.28 and newer look it up
 * (dlsym "ncclTunerPlugin_v5"). Declared here from NCCL's documented ABI
 * rather than included, so the plugin builds without NCCL's sources and the C
 * test harness loads it through exactly what NCCL sees. Plain C: the harness
 * is C, as a vendor's NCCL build would be.
 *
 * Facts of the ABI this depends on:
 * - the cost table is float[numAlgo][numProto], row per algorithm, passed as
 *   float**; NCCL takes the (algorithm, protocol) of least cost, so a plugin
 *   chooses by writing 0 there; an entry of -1 means NCCL cannot run that pair;
 * - *nChannels left 0 keeps NCCL's channel count, anything else replaces it
 *   (NCCL still caps it at the channels the communicator was built with);
 * - init and getCollInfo returning anything but success fail the
 *   communicator or the call, so a plugin that cannot tune must still succeed. */
#ifndef POD_INIT_NCCL_TUNER_ABI_H
#define POD_INIT_NCCL_TUNER_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6
} ncclResult_t;

/* The collectives, in NCCL's numbering. */
typedef enum {
  ncclFuncBroadcast = 0,
  ncclFuncReduce = 1,
  ncclFuncAllGather = 2,
  ncclFuncReduceScatter = 3,
  ncclFuncAllReduce = 4
} ncclFunc_t;

/* Rows and columns of the cost table. */
enum {
  POD_INIT_NCCL_ALGO_TREE = 0,
  POD_INIT_NCCL_ALGO_RING = 1,
  POD_INIT_NCCL_ALGO_COLLNET_DIRECT = 2,
  POD_INIT_NCCL_ALGO_COLLNET_CHAIN = 3,
  POD_INIT_NCCL_ALGO_NVLS = 4,
  POD_INIT_NCCL_ALGO_NVLS_TREE = 5,
  POD_INIT_NCCL_ALGO_PAT = 6,
  POD_INIT_NCCL_NUM_ALGORITHMS = 7
};
enum {
  POD_INIT_NCCL_PROTO_LL = 0,
  POD_INIT_NCCL_PROTO_LL128 = 1,
  POD_INIT_NCCL_PROTO_SIMPLE = 2,
  POD_INIT_NCCL_NUM_PROTOCOLS = 3
};
#define POD_INIT_NCCL_COST_UNAVAILABLE (-1.0f)

/* NCCL's log levels and the subsystem flag tuner lines go under. */
enum { POD_INIT_NCCL_LOG_WARN = 2, POD_INIT_NCCL_LOG_INFO = 3 };
enum { POD_INIT_NCCL_SUBSYS_INIT = 1, POD_INIT_NCCL_SUBSYS_TUNING = 64 };

typedef void (*ncclDebugLogger_t)(int level, unsigned long flags, const char* file, int line,
                                  const char* fmt, ...);

typedef struct {
  int nNvlDomains;
  int minRanksPerNvlDomain;
  int maxRanksPerNvlDomain;
} ncclNvlDomainInfo_v5_t;

/* NCCL's latency and bandwidth model, which a plugin may adjust. This one
 * does not, so the layout (which grew between NCCL releases) stays opaque. */
typedef struct ncclTunerConstants_v5 ncclTunerConstants_v5_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, size_t nRanks, size_t nNodes,
                       ncclDebugLogger_t logFunction, ncclNvlDomainInfo_v5_t* nvlDomainInfo,
                       ncclTunerConstants_v5_t* constants);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff,
                              int* nChannels);
  ncclResult_t (*finalize)(void* context);
} ncclTuner_v5_t;

#ifdef __cplusplus
}
#endif

#endif
