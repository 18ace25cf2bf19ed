// A stand-in libnvidia-ml.so.1 that answers the NVML calls pyinit makes from
// a recording of a real node (tests/data/*-nvml.json, turned into lines by
// tests/test_nvml_native.py), with nvml.h's types and return codes. The file
// is named by $NVML_REPLAY_FILE when NVML is initialised; its lines:
//   driver VERSION
//   gpu BUS_ID SM_MAJOR SM_MINOR MEMORY BAR1 GEN MAX_GEN WIDTH MAX_WIDTH NAME...
//   link GPU LINK REMOTE_BUS_ID TYPE|-
//   p2p A B S0 S1 S2 S3 S4
//   ancestor A B LEVEL
//   health GPU ECC|- ECC_UNCORRECTED|- REMAPPED|- PENDING|- FAILED|-
//   counters GPU UUID UTIL MEMORY_USED TX_KIB RX_KIB CELSIUS NVLINK_TX_KIB|- NVLINK_RX_KIB|-
//   xid GPU XID
//   lost GPU          (every query of that GPU answers "GPU is lost")
//   unterminated GPU  (its name fills the caller's buffer with no NUL after it)
// A "-" is a query the GPU does not support. GPUs are numbered as they come.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvml_common.h"

enum { kMaxGpus = 16, kMaxLinks = 18, kMaxXids = 16 };

typedef struct {
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
} PciInfo;

typedef struct {
  unsigned long long total, free, used;
} Memory;

typedef struct {
  unsigned field_id, scope_id;
  long long timestamp, latency_us;
  int value_type, result;
  unsigned long long value;
} FieldValue;

typedef struct {
  void* device;
  unsigned long long type, data;
  unsigned gpu_instance, compute_instance;
} EventData;

typedef struct {
  int known;
  long long value;
} Maybe;

typedef struct {
  char bus_id[32], name[96], uuid[96];
  int sm[2], pcie[4], lost, unterminated;
  unsigned long long memory, bar1, memory_used;
  int links;  // active links recorded
  unsigned link_ids[kMaxLinks];
  char remote[kMaxLinks][32];
  Maybe remote_type[kMaxLinks];
  Maybe health[5];
  unsigned util, tx_kib, rx_kib, celsius;
  Maybe nvlink_kib[2];
} Gpu;

static char driver[80];
static Gpu gpus[kMaxGpus];
static int gpu_count;
static int p2p[kMaxGpus][kMaxGpus][5];
static int ancestor[kMaxGpus][kMaxGpus];
static int xids[kMaxXids][2];
static int xid_count, xid_next, watching[kMaxGpus];

static Maybe maybe(const char* word) {
  Maybe m = {0, 0};
  if (word != NULL && strcmp(word, "-") != 0) {
    m.known = 1;
    m.value = strtoll(word, NULL, 10);
  }
  return m;
}

static Gpu* gpu_at(const char* word) {
  int index = word ? atoi(word) : -1;
  return index >= 0 && index < gpu_count ? &gpus[index] : NULL;
}

static void read_line(char* line) {
  char* words[16] = {0};
  int count = 0;
  char* rest = NULL;
  for (char* word = strtok_r(line, " \n", &rest); word && count < 16;
       word = strtok_r(NULL, " \n", &rest)) {
    words[count++] = word;
    if (strcmp(words[0], "gpu") == 0 && count == 10) break;  // the name is the rest
  }
  if (count == 0) return;
  if (strcmp(words[0], "driver") == 0 && count > 1) {
    snprintf(driver, sizeof driver, "%s", words[1]);
  } else if (strcmp(words[0], "gpu") == 0 && count == 10 && gpu_count < kMaxGpus) {
    Gpu* g = &gpus[gpu_count++];
    memset(g, 0, sizeof *g);
    snprintf(g->bus_id, sizeof g->bus_id, "%s", words[1]);
    g->sm[0] = atoi(words[2]);
    g->sm[1] = atoi(words[3]);
    g->memory = strtoull(words[4], NULL, 10);
    g->bar1 = strtoull(words[5], NULL, 10);
    for (int i = 0; i < 4; ++i) g->pcie[i] = atoi(words[6 + i]);
    snprintf(g->name, sizeof g->name, "%s", rest ? strtok_r(NULL, "\n", &rest) : "");
    snprintf(g->uuid, sizeof g->uuid, "GPU-replay-%d", gpu_count - 1);
  } else if (strcmp(words[0], "link") == 0 && count == 5 && gpu_at(words[1])) {
    Gpu* g = gpu_at(words[1]);
    if (g->links < kMaxLinks) {
      g->link_ids[g->links] = (unsigned)atoi(words[2]);
      snprintf(g->remote[g->links], 32, "%s", words[3]);
      g->remote_type[g->links] = maybe(words[4]);
      g->links++;
    }
  } else if ((strcmp(words[0], "p2p") == 0 && count == 8) ||
             (strcmp(words[0], "ancestor") == 0 && count == 4)) {
    int a = atoi(words[1]), b = atoi(words[2]);
    if (a < 0 || b < 0 || a >= kMaxGpus || b >= kMaxGpus) return;
    if (words[0][0] == 'p') {
      for (int i = 0; i < 5; ++i) p2p[a][b][i] = atoi(words[3 + i]);
    } else {
      ancestor[a][b] = atoi(words[3]);
    }
  } else if (strcmp(words[0], "health") == 0 && count == 7 && gpu_at(words[1])) {
    for (int i = 0; i < 5; ++i) gpu_at(words[1])->health[i] = maybe(words[2 + i]);
  } else if (strcmp(words[0], "counters") == 0 && count == 10 && gpu_at(words[1])) {
    Gpu* g = gpu_at(words[1]);
    snprintf(g->uuid, sizeof g->uuid, "%s", words[2]);
    g->util = (unsigned)atoi(words[3]);
    g->memory_used = strtoull(words[4], NULL, 10);
    g->tx_kib = (unsigned)atoi(words[5]);
    g->rx_kib = (unsigned)atoi(words[6]);
    g->celsius = (unsigned)atoi(words[7]);
    g->nvlink_kib[0] = maybe(words[8]);
    g->nvlink_kib[1] = maybe(words[9]);
  } else if (strcmp(words[0], "xid") == 0 && count == 3 && gpu_at(words[1]) &&
             xid_count < kMaxXids) {
    xids[xid_count][0] = atoi(words[1]);
    xids[xid_count++][1] = atoi(words[2]);
  } else if (strcmp(words[0], "lost") == 0 && count == 2 && gpu_at(words[1])) {
    gpu_at(words[1])->lost = 1;
  } else if (strcmp(words[0], "unterminated") == 0 && count == 2 && gpu_at(words[1])) {
    gpu_at(words[1])->unterminated = 1;
  }
}

int nvmlInit_v2(void) {
  const char* path = getenv("NVML_REPLAY_FILE");
  FILE* file = path ? fopen(path, "r") : NULL;
  char line[512];
  if (file == NULL) return kDriverNotLoaded;
  gpu_count = xid_count = xid_next = 0;
  memset(p2p, 0, sizeof p2p);
  memset(watching, 0, sizeof watching);
  for (int a = 0; a < kMaxGpus; ++a)
    for (int b = 0; b < kMaxGpus; ++b) ancestor[a][b] = 30;
  while (fgets(line, sizeof line, file)) read_line(line);
  fclose(file);
  return kSuccess;
}

// A handle is its Gpu; a lost GPU answers every query so.
#define GPU_OF(handle)                          \
  Gpu* g = (Gpu*)(handle);                      \
  if (g < gpus || g >= gpus + gpu_count) return kInvalidArgument; \
  if (g->lost) return kGpuIsLost

static int text_out(const char* text, char* out, unsigned size) {
  if (strlen(text) >= size) return kInvalidArgument;
  strcpy(out, text);
  return kSuccess;
}

int nvmlSystemGetDriverVersion(char* out, unsigned size) { return text_out(driver, out, size); }

int nvmlDeviceGetCount_v2(unsigned* count) {
  *count = (unsigned)gpu_count;
  return kSuccess;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned index, void** handle) {
  if (index >= (unsigned)gpu_count) return kInvalidArgument;
  *handle = &gpus[index];
  return kSuccess;
}

int nvmlDeviceGetPciInfo_v3(void* handle, PciInfo* pci) {
  GPU_OF(handle);
  memset(pci, 0, sizeof *pci);
  snprintf(pci->bus_id, sizeof pci->bus_id, "%s", g->bus_id);
  return kSuccess;
}

int nvmlDeviceGetName(void* handle, char* out, unsigned size) {
  GPU_OF(handle);
  if (g->unterminated) {
    memset(out, 'X', size);
    return kSuccess;
  }
  return text_out(g->name, out, size);
}

int nvmlDeviceGetUUID(void* handle, char* out, unsigned size) {
  GPU_OF(handle);
  return text_out(g->uuid, out, size);
}

int nvmlDeviceGetCudaComputeCapability(void* handle, int* major, int* minor) {
  GPU_OF(handle);
  *major = g->sm[0];
  *minor = g->sm[1];
  return kSuccess;
}

int nvmlDeviceGetMemoryInfo(void* handle, Memory* memory) {
  GPU_OF(handle);
  memory->total = g->memory;
  memory->used = g->memory_used;
  memory->free = g->memory - g->memory_used;
  return kSuccess;
}

int nvmlDeviceGetBAR1MemoryInfo(void* handle, Memory* bar1) {
  GPU_OF(handle);
  bar1->total = bar1->free = g->bar1;
  bar1->used = 0;
  return kSuccess;
}

static int pcie(void* handle, int which, unsigned* out) {
  GPU_OF(handle);
  *out = (unsigned)g->pcie[which];
  return kSuccess;
}
int nvmlDeviceGetCurrPcieLinkGeneration(void* h, unsigned* out) { return pcie(h, 0, out); }
int nvmlDeviceGetMaxPcieLinkGeneration(void* h, unsigned* out) { return pcie(h, 1, out); }
int nvmlDeviceGetCurrPcieLinkWidth(void* h, unsigned* out) { return pcie(h, 2, out); }
int nvmlDeviceGetMaxPcieLinkWidth(void* h, unsigned* out) { return pcie(h, 3, out); }

static int recorded_link(Gpu* g, unsigned link) {
  for (int i = 0; i < g->links; ++i)
    if (g->link_ids[i] == link) return i;
  return -1;
}

int nvmlDeviceGetNvLinkState(void* handle, unsigned link, int* active) {
  GPU_OF(handle);
  if (g->links == 0 || link >= kMaxLinks) return kNotSupported;
  *active = recorded_link(g, link) >= 0;
  return kSuccess;
}

int nvmlDeviceGetNvLinkRemotePciInfo_v2(void* handle, unsigned link, PciInfo* pci) {
  GPU_OF(handle);
  int i = recorded_link(g, link);
  if (i < 0) return kNotSupported;
  memset(pci, 0, sizeof *pci);
  snprintf(pci->bus_id, sizeof pci->bus_id, "%s", g->remote[i]);
  return kSuccess;
}

int nvmlDeviceGetNvLinkRemoteDeviceType(void* handle, unsigned link, unsigned* type) {
  GPU_OF(handle);
  int i = recorded_link(g, link);
  if (i < 0 || !g->remote_type[i].known) return kNotSupported;
  *type = (unsigned)g->remote_type[i].value;
  return kSuccess;
}

int nvmlDeviceGetP2PStatus(void* a, void* b, int capability, int* status) {
  GPU_OF(a);
  Gpu* other = (Gpu*)b;
  if (capability < 0 || capability > 4 || other < gpus || other >= gpus + gpu_count) {
    return kInvalidArgument;
  }
  *status = p2p[g - gpus][other - gpus][capability];
  return kSuccess;
}

int nvmlDeviceGetTopologyCommonAncestor(void* a, void* b, int* level) {
  GPU_OF(a);
  Gpu* other = (Gpu*)b;
  if (other < gpus || other >= gpus + gpu_count) return kInvalidArgument;
  *level = ancestor[g - gpus][other - gpus];
  return kSuccess;
}

int nvmlDeviceGetEccMode(void* handle, int* current, int* pending) {
  GPU_OF(handle);
  if (!g->health[0].known) return kNotSupported;
  *current = *pending = (int)g->health[0].value;
  return kSuccess;
}

int nvmlDeviceGetTotalEccErrors(void* handle, int type, int counter, unsigned long long* count) {
  GPU_OF(handle);
  if (type != 1 || counter != 0) return kInvalidArgument;  // uncorrected, volatile: asked alone
  if (!g->health[1].known) return kNotSupported;
  *count = (unsigned long long)g->health[1].value;
  return kSuccess;
}

int nvmlDeviceGetRemappedRows(void* handle, unsigned* corrected, unsigned* uncorrected,
                              unsigned* pending, unsigned* failed) {
  GPU_OF(handle);
  if (!g->health[2].known) return kNotSupported;
  *corrected = 0;
  *uncorrected = (unsigned)g->health[2].value;
  *pending = (unsigned)g->health[3].value;
  *failed = (unsigned)g->health[4].value;
  return kSuccess;
}

int nvmlDeviceGetUtilizationRates(void* handle, unsigned* rates) {
  GPU_OF(handle);
  rates[0] = g->util;
  rates[1] = 0;
  return kSuccess;
}

int nvmlDeviceGetPcieThroughput(void* handle, int counter, unsigned* kib) {
  GPU_OF(handle);
  if (counter != 0 && counter != 1) return kInvalidArgument;
  *kib = counter == 0 ? g->tx_kib : g->rx_kib;
  return kSuccess;
}

int nvmlDeviceGetTemperature(void* handle, int sensor, unsigned* celsius) {
  GPU_OF(handle);
  if (sensor != 0) return kInvalidArgument;
  *celsius = g->celsius;
  return kSuccess;
}

// NVLink data counters (fields 138 TX and 139 RX, scope: the link): the
// recorded total on link 0, every other link without a counter.
int nvmlDeviceGetFieldValues(void* handle, int count, FieldValue* values) {
  GPU_OF(handle);
  if (!g->nvlink_kib[0].known) return kNotSupported;
  for (int i = 0; i < count; ++i) {
    FieldValue* v = &values[i];
    int direction = v->field_id == 138 ? 0 : v->field_id == 139 ? 1 : -1;
    v->result = direction >= 0 && v->scope_id == 0 ? kSuccess : kNotSupported;
    if (v->result == kSuccess) v->value = (unsigned long long)g->nvlink_kib[direction].value;
  }
  return kSuccess;
}

int nvmlEventSetCreate(void** set) {
  *set = watching;
  return kSuccess;
}

int nvmlEventSetFree(void* set) { return set == watching ? kSuccess : kInvalidArgument; }

int nvmlDeviceRegisterEvents(void* handle, unsigned long long types, void* set) {
  GPU_OF(handle);
  if (set != watching || types != 0x8) return kInvalidArgument;
  watching[g - gpus] = 1;
  return kSuccess;
}

int nvmlEventSetWait_v2(void* set, EventData* event, unsigned timeout_ms) {
  (void)timeout_ms;
  if (set != watching) return kInvalidArgument;
  while (xid_next < xid_count && !watching[xids[xid_next][0]]) ++xid_next;
  if (xid_next >= xid_count) return kTimeout;
  memset(event, 0, sizeof *event);
  event->device = &gpus[xids[xid_next][0]];
  event->type = 0x8;
  event->data = (unsigned long long)xids[xid_next++][1];
  return kSuccess;
}
