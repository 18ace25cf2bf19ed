// Stand-ins for nvidia-persistenced and nv-fabricmanager in the boot tests,
// one program named by argv[0]. Each returns once its daemon runs, as the
// real ones do. The persistence daemon holds /dev/nvidiactl open and says so
// in /run/standin-nvml/persistence; the fabric manager reports "in-progress"
// in /run/standin-nvml/fabric, then "completed" after the milliseconds given
// by standin_fabric_ms= on the kernel command line (default 1500).
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void say(const char* name, const char* text) {
  char path[96];
  snprintf(path, sizeof path, "/run/standin-nvml/%s", name);
  FILE* file = fopen(path, "w");
  if (file) {
    fputs(text, file);
    fclose(file);
  }
}

static long fabric_ms(void) {
  char line[4096] = "";
  FILE* file = fopen("/proc/cmdline", "r");
  if (file) {
    if (fgets(line, sizeof line, file) == NULL) line[0] = 0;
    fclose(file);
  }
  const char* at = strstr(line, "standin_fabric_ms=");
  return at ? atol(at + strlen("standin_fabric_ms=")) : 1500;
}

int main(int argc, char** argv) {
  (void)argc;
  const char* name = basename(argv[0]);
  mkdir("/run/standin-nvml", 0755);
  int control = open("/dev/nvidiactl", O_RDWR);
  if (control < 0) {
    perror("/dev/nvidiactl");
    return 1;
  }
  if (fork() > 0) return 0;  // the daemon goes on
  setsid();
  if (strcmp(name, "nv-fabricmanager") == 0) {
    say("fabric", "in-progress\n");
    usleep((useconds_t)fabric_ms() * 1000);
    say("fabric", "completed\n");
  } else {
    say("persistence", "daemon\n");
  }
  for (;;) pause();
}
