// What pod-init does as the machine's init: read from an optional file in the
// boot image (/etc/pod-init.conf, one podinit.KEY=VALUE per line) and then the
// kernel command line (/proc/cmdline), whose values win.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace pod_init {

enum class EndAction { Poweroff, Reboot, Halt };

struct InitConfig {
  std::vector<std::string> command;  // podinit.cmd=, or the words after "--" on the command line
  std::vector<std::string> modules;  // podinit.modules=a,b,c
  // podinit.wait=/dev/a,/dev/b: paths to wait for (drivers probe in the
  // background) before the command; data and root devices are waited for too.
  std::vector<std::string> wait;
  std::string hostname;  // podinit.hostname=
  std::string data;      // podinit.data=DEVICE[:MOUNTPOINT], mounted before the command
  std::string root;      // podinit.root=DEVICE|DIR: switched into before the command
  int expect_gpus = -1;  // podinit.expect_gpus=
  EndAction end = EndAction::Poweroff;  // podinit.end=poweroff|reboot|halt
  unsigned grace_s = 10;                // podinit.grace=: TERM to KILL at shutdown
  // podinit.warm=on|MOD,...: a warm interpreter (pyinit warm start, with these
  // preloads) started as soon as the root is mounted, beside the boot's other steps.
  bool warm = false;
  std::string warm_preloads;
  // podinit.nvreg=NVreg_A=1,NVreg_B=2: the nvidia module's parameters, as
  // finit_module takes them ("NVreg_A=1 NVreg_B=2").
  std::string nvreg;
  // podinit.modules_lock=on|off: after a GPU bring-up, no module loads again
  // (/proc/sys/kernel/modules_disabled).
  bool modules_lock = true;
  // podinit.gpu_wait=S: the deadline for GPUs to appear, daemons to start and
  // the fabric to complete.
  unsigned gpu_wait_s = 120;
  // podinit.sysfs=DIR: the tree the scan reads (a recorded one, to rehearse a node).
  std::string sysfs_root = "/sys";
};

// Splits a kernel command line the way the kernel does: on spaces, with double
// quotes grouping ("a=b c" or a="b c"; the quotes are dropped).
std::vector<std::string> split_cmdline(std::string_view text);

// Applies every podinit.* word of `words` to `config`; other words belong to
// the kernel and are ignored, and words after "--" become the command.
// Appends "SOURCE: message" to `errors` for unknown keys and bad values.
void apply_init_params(const std::vector<std::string>& words, const std::string& source,
                       InitConfig* config, std::vector<std::string>* errors);

// The file form: podinit.KEY=VALUE per line (the value is the rest of the
// line), # comments.
// Errors name the file and line.
void apply_init_file(std::string_view text, const std::string& path, InitConfig* config,
                     std::vector<std::string>* errors);
// One such line, its errors prefixed with `where` ("FILE:LINE", "argument 2").
void apply_init_line(std::string_view line, const std::string& where, InitConfig* config,
                     std::vector<std::string>* errors);

const char* end_action_name(EndAction action);

}  // namespace pod_init
