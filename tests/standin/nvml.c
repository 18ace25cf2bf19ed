// A stand-in libnvidia-ml.so.1 for the boot tests: the NVML calls
// pod-init-nvml makes, answered from what the stand-in driver and daemons
// leave: GPUs from /proc/driver/nvidia/gpus, NVSwitches from
// /proc/driver/nvidia-nvswitch/devices, persistence and the fabric's state
// from /run/standin-nvml (written by the stand-in daemons, or here).
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nvml_common.h"

enum { kMaxGpus = 64 };

typedef struct {
  unsigned char cluster_uuid[16];
  int status;
  unsigned clique_id;
  unsigned char state;
} FabricInfo;

static char gpus[kMaxGpus][32];
static int gpu_count;
static int nvswitches;
static int handles[kMaxGpus];

static int entries(const char* folder, char names[][32]) {
  DIR* dir = opendir(folder);
  int count = 0;
  struct dirent* entry;
  while (dir && (entry = readdir(dir)) != NULL && count < kMaxGpus) {
    if (entry->d_name[0] != '.') snprintf(names[count++], 32, "%s", entry->d_name);
  }
  if (dir) closedir(dir);
  return count;
}

int nvmlInit_v2(void) {
  static char switches[kMaxGpus][32];
  gpu_count = entries("/proc/driver/nvidia/gpus", gpus);
  nvswitches = entries("/proc/driver/nvidia-nvswitch/devices", switches);
  return gpu_count > 0 ? kSuccess : kDriverNotLoaded;
}

int nvmlDeviceGetHandleByPciBusId_v2(const char* bus_id, void** device) {
  for (int i = 0; i < gpu_count; ++i) {
    if (strcasecmp(gpus[i], bus_id) == 0) {
      handles[i] = i;
      *device = &handles[i];
      return kSuccess;
    }
  }
  return kNotFound;
}

static int state_file(const char* name, char* text, size_t size) {
  char path[96];
  snprintf(path, sizeof path, "/run/standin-nvml/%s", name);
  FILE* file = fopen(path, "r");
  if (file == NULL) return -1;
  size_t got = fread(text, 1, size - 1, file);
  fclose(file);
  text[got] = 0;
  return 0;
}

int nvmlDeviceGetPersistenceMode(void* device, int* mode) {
  char text[16];
  (void)device;
  *mode = state_file("persistence", text, sizeof text) == 0;
  return kSuccess;
}

int nvmlDeviceSetPersistenceMode(void* device, int mode) {
  (void)device;
  mkdir("/run/standin-nvml", 0755);
  if (!mode) return unlink("/run/standin-nvml/persistence") == 0 || errno == ENOENT ? 0 : 999;
  FILE* file = fopen("/run/standin-nvml/persistence", "w");
  if (file == NULL) return 999;
  fputs("nvml\n", file);
  fclose(file);
  return kSuccess;
}

int nvmlDeviceGetGpuFabricInfo(void* device, FabricInfo* info) {
  char text[32] = "";
  (void)device;
  if (!nvswitches) return kNotSupported;  // as NVML says on a board without NVSwitches
  memset(info, 0, sizeof *info);
  info->state = 1;  // not started
  if (state_file("fabric", text, sizeof text) == 0) {
    info->state = strncmp(text, "completed", 9) == 0 ? 3 : 2;
  }
  return kSuccess;
}

int nvmlDeviceGetCudaComputeCapability(void* device, int* major, int* minor) {
  (void)device;
  *major = 9;
  *minor = 0;
  return kSuccess;
}

int nvmlDeviceGetNvLinkState(void* device, unsigned link, int* active) {
  (void)device;
  if (!nvswitches) return kNotSupported;
  *active = link < 18;
  return kSuccess;
}

int nvmlDeviceGetNvLinkRemoteDeviceType(void* device, unsigned link, unsigned* type) {
  (void)device;
  (void)link;
  *type = 2;  // an NVSwitch
  return nvswitches ? kSuccess : kNotSupported;
}

int nvmlDeviceGetNvLinkRemotePciInfo_v2(void* device, unsigned link, void* info) {
  (void)device;
  (void)link;
  (void)info;
  return kNotSupported;
}
