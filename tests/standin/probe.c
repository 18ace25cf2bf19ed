// The command a boot test runs after PID 1's NVIDIA bring-up: what a later
// module load gets, and what the driver and PID 1 left, one "probe:" line each.
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

static void show_file(const char* label, const char* path) {
  char text[1 << 16] = "";
  FILE* file = fopen(path, "r");
  size_t got = file ? fread(text, 1, sizeof text - 1, file) : 0;
  if (file) fclose(file);
  text[got] = 0;
  for (char* c = text; *c; ++c)
    if (*c == '\n') *c = ' ';
  printf("probe: %s %s\n", label, file ? text : strerror(errno));
}

int main(int argc, char** argv) {
  show_file("modules_disabled", "/proc/sys/kernel/modules_disabled");
  if (argc > 1) {
    int fd = open(argv[1], O_RDONLY);
    long rc = fd < 0 ? -1 : syscall(SYS_finit_module, fd, "", 0);
    printf("probe: finit_module %s: %s\n", argv[1], rc == 0 ? "loaded" : strerror(errno));
  }
  show_file("NVreg_EnableGpuFirmware", "/sys/module/nvidia/parameters/NVreg_EnableGpuFirmware");
  struct stat st;
  if (stat("/dev/nvidia0", &st) == 0) {
    printf("probe: /dev/nvidia0 %u:%u\n", major(st.st_rdev), minor(st.st_rdev));
  }
  show_file("node.json", "/run/pod-init/node.json");
  show_file("nccl-topo.xml", "/run/pod-init/nccl/nccl-topo.xml");
  fflush(stdout);
  return 0;
}
