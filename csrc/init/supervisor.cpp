#include "init/supervisor.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.hpp"
#include "common/error.hpp"
#include "common/sysfs.hpp"
#include "common/text.hpp"

namespace pod_init {

namespace {

constexpr int kForwarded[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGQUIT, SIGWINCH};
// How long end_children() waits, after KILL, for processes stuck in the kernel.
constexpr unsigned kKillWaitMs = 5000;

// The signal the kernel sends when the starter dies (end_with_parent): one of
// the real-time signals nobody forwards, so it cannot be mistaken for a user's.
int parent_died_signal() { return SIGRTMIN + 3; }

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// Signals arrive by sigtimedwait, never by handlers: blocked ones are queued
// for us even as PID 1 of a namespace, where unhandled ones would be dropped.
sigset_t supervised_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  for (int sig : kForwarded) sigaddset(&set, sig);
  return set;
}

// What the child tells the supervisor before it execs (or fails to): the
// step and its errno. The pipe closes on exec, so a supervisor that reads no
// record knows the command runs.
struct ChildReport {
  int step;  // a ChildStep, the index into kChildSteps
  int err;
};
enum ChildStep { kExec, kDeathSignal, kSetpgid, kTcsetpgrp };
constexpr const char* kChildSteps[] = {"exec", "prctl(PR_SET_PDEATHSIG)", "setpgid", "tcsetpgrp"};

// Only async-signal-safe calls from here to the exec: the caller may have threads.
void report_child(int report_fd, ChildStep step, int err) {
  ChildReport report{step, err};
  ssize_t ignored = write(report_fd, &report, sizeof report);
  (void)ignored;
}

[[noreturn]] void exec_child(const SupervisorOptions& options, const sigset_t& supervised,
                             pid_t parent, int report_fd) {
  if (options.parent_death_signal != 0) {
    if (int rc = die_with_parent(options.parent_death_signal, parent); rc < 0) {
      report_child(report_fd, kDeathSignal, -rc);
      _exit(126);
    }
  }
  // The caller may have blocked these for every thread; the command must not inherit that.
  sigprocmask(SIG_UNBLOCK, &supervised, nullptr);
  if (options.process_group) {
    if (setpgid(0, 0) != 0) {
      report_child(report_fd, kSetpgid, errno);
      _exit(126);
    }
    if (isatty(STDIN_FILENO)) {
      // A background group may not take the terminal without this. Not fatal:
      // the command runs, without the terminal's signals (said by the supervisor).
      signal(SIGTTOU, SIG_IGN);
      if (tcsetpgrp(STDIN_FILENO, getpid()) != 0) report_child(report_fd, kTcsetpgrp, errno);
      signal(SIGTTOU, SIG_DFL);
    }
  }
  std::vector<char*> argv;
  for (const std::string& arg : options.command) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  if (options.environment.empty()) {
    execvp(argv[0], argv.data());
  } else {
    std::vector<char*> envp;
    for (const std::string& entry : options.environment) {
      envp.push_back(const_cast<char*>(entry.c_str()));
    }
    envp.push_back(nullptr);
    // PATH for the lookup is the command's own, as env(1) does it.
    for (const std::string& entry : options.environment) {
      if (entry.rfind("PATH=", 0) == 0) setenv("PATH", entry.c_str() + 5, 1);
    }
    execvpe(argv[0], argv.data(), envp.data());
  }
  int err = errno;
  report_child(report_fd, kExec, err);
  _exit(err == ENOENT || err == ENOTDIR ? 127 : 126);
}

}  // namespace

int die_with_parent(int signal, pid_t parent) {
  if (prctl(PR_SET_PDEATHSIG, signal, 0, 0, 0) != 0) return -errno;
  // The parent may have died between fork and prctl: then no signal would come.
  if (getppid() != parent) raise(signal);
  return 0;
}

namespace {
constexpr int kIoprioWhoProcess = 1;  // linux/ioprio.h: IOPRIO_WHO_PROCESS
}  // namespace

int io_priority(pid_t pid) {
  long priority = syscall(SYS_ioprio_get, kIoprioWhoProcess, pid);
  return priority < 0 ? -errno : static_cast<int>(priority);
}

int set_io_priority(int priority) {
  return syscall(SYS_ioprio_set, kIoprioWhoProcess, 0, priority) == 0 ? 0 : -errno;
}

int become_subreaper() { return prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0 ? 0 : -errno; }

int set_arguments_shown(const std::vector<std::string>& arguments) {
  std::string stat;
  if (int rc = sysfs::read_text("/proc/self/stat", &stat); rc < 0) return rc;
  // Fields after the name's closing parenthesis (the name may hold spaces):
  // the state is field 3, arg_start 48 and arg_end 49.
  size_t close = stat.rfind(')');
  if (close == std::string::npos) return -EPROTO;
  std::vector<std::string> fields = split_on(std::string_view(stat).substr(close + 1), ' ');
  if (fields.size() < 47) return -EPROTO;
  std::optional<int64_t> start = sysfs::parse_int(fields[45]);
  std::optional<int64_t> end = sysfs::parse_int(fields[46]);
  if (!start || !end || *start <= 0 || *end <= *start) return -EPROTO;
  char* line = reinterpret_cast<char*>(static_cast<uintptr_t>(*start));
  size_t room = static_cast<size_t>(*end - *start);
  size_t name = strnlen(line, room);
  if (name >= room) return -EPROTO;  // already rewritten past its end
  std::string shown;
  for (const std::string& argument : arguments) shown.append(argument).push_back('\0');
  size_t after = room - name - 1;
  size_t n = std::min(shown.size(), after);
  std::memcpy(line + name + 1, shown.data(), n);
  std::memset(line + name + 1 + n, 0, after - n);
  line[room - 1] = '\0';  // a cut argument still ends; the kernel reads no further
  return static_cast<int>(name + 1 + n);
}

namespace {

// One supervised command: what supervise()'s loop reads and changes.
struct Supervision {
  const SupervisorOptions& options;
  sigset_t set;          // the signals waited for
  sigset_t parent_mask;  // the caller's mask, restored at the end
  pid_t child = -1;
  pid_t target = -1;     // the child, or its process group
  uint64_t kill_at = 0;  // when a forwarded TERM/INT runs out of grace; 0: none pending
  int status = 0;
  bool ended = false;

  void log(const std::string& line) const {
    if (options.log) options.log(line);
  }
  [[noreturn]] void fail(const char* what) const {
    int err = errno;
    sigprocmask(SIG_SETMASK, &parent_mask, nullptr);
    throw SysError(err, what);
  }
};

// Forks and execs the command; every step the child reports failing (before
// or at its exec) is one line.
void start_child(Supervision* run) {
  const SupervisorOptions& options = run->options;
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) run->fail("pipe");
  const pid_t parent = getpid();
  run->child = fork();
  if (run->child < 0) {
    int err = errno;
    close(report[0]);
    close(report[1]);
    errno = err;
    run->fail("fork");
  }
  if (run->child == 0) exec_child(options, run->set, parent, report[1]);
  // Also here, so no signal can reach the group before the child made it.
  // EACCES: the child has exec'd already, having made the group itself.
  if (options.process_group && setpgid(run->child, run->child) != 0 && errno != EACCES) {
    run->log(std::string("setpgid of the command: ") + errno_text(errno));
  }
  run->target = options.process_group ? -run->child : run->child;
  close(report[1]);
  for (;;) {
    ChildReport told{};
    ssize_t got = read(report[0], &told, sizeof told);
    if (got < 0 && errno == EINTR) continue;
    if (got != static_cast<ssize_t>(sizeof told)) break;  // EOF: the command runs
    const std::string& name = options.command[0];
    const std::string what =
        told.step == kExec ? "cannot run '" + name + "'"
                           : std::string(kChildSteps[told.step]) + " before running '" + name + "'";
    run->log(what + ": " + errno_text(told.err));
  }
  close(report[0]);
}

// Whether the command was sent `info`'s signal with this process: a terminal's
// Ctrl-C, Ctrl-\ (QUIT), hangup or resize (sent by the kernel) reaches the whole
// foreground process group, and the command shares it unless it leads its own.
// A second copy would land inside the command's handling of the first (torchrun
// takes a second INT as an order to stop its workers at once, with TERM).
bool terminal_sent_it_too(const Supervision& run, const siginfo_t& info) {
  return info.si_code == SI_KERNEL && !run.options.process_group && isatty(STDIN_FILENO) &&
         tcgetpgrp(STDIN_FILENO) == getpgrp() && getpgid(run.child) == getpgrp();
}

// Passes a signal on to the command (unless it had it from the terminal as
// well); TERM and INT start the grace period. One line per signal from
// outside: the grace's (always said), else -v's.
void forward(Supervision* run, int sig, const siginfo_t& info) {
  const SupervisorOptions& options = run->options;
  const bool from_outside = options.on_signal ? options.on_signal(sig) : true;
  const bool starts_grace = (sig == SIGTERM || sig == SIGINT) && run->kill_at == 0;
  const bool had_it = terminal_sent_it_too(*run, info);
  const std::string to =
      had_it ? std::string("the terminal sent ") + sigabbrev_np(sig) + " to the command as well"
             : std::string("forwarded ") + sigabbrev_np(sig) +
                   (options.process_group ? " to the command's process group" : " to the command");
  // ESRCH: it ended and is reaped below; anything else is worth a line.
  if (!had_it && kill(run->target, sig) != 0 && errno != ESRCH) {
    run->log(std::string("cannot forward ") + sigabbrev_np(sig) + ": " + errno_text(errno));
  } else if (starts_grace && from_outside) {
    run->log(to + "; KILL in " + std::to_string(options.grace_ms) + " ms if it has not ended");
  } else if (options.verbose && from_outside) {
    run->log(to);
  }
  if (starts_grace) run->kill_at = monotonic_ms() + options.grace_ms;
}

// Reaps everything that ended: the command, and orphans that re-parented here.
void reap(Supervision* run) {
  for (;;) {
    int reaped_status = 0;
    pid_t pid = waitpid(-1, &reaped_status, WNOHANG);
    if (pid < 0 && errno == EINTR) continue;
    if (pid < 0 && errno == ECHILD && !run->ended) {
      // Someone else in this process reaped the command: its status is lost.
      run->log("the command was reaped elsewhere; its exit status is unknown");
      run->status = 1 << 8;
      run->ended = true;
    }
    if (pid <= 0) return;
    if (pid == run->child) {
      run->status = reaped_status;
      run->ended = true;
    } else if (run->options.verbose) {
      run->log("reaped orphan " + std::to_string(pid));
    }
  }
}

// How long the next wait may last: to the next tick, or to the grace's end.
timespec wait_time(const Supervision& run) {
  uint64_t now = monotonic_ms();
  uint64_t tick = run.options.tick_ms;
  uint64_t wait_ms = tick > 0 ? std::min<uint64_t>(tick, 1000) : 1000;
  if (run.kill_at != 0) wait_ms = run.kill_at > now ? std::min(run.kill_at - now, wait_ms) : 0;
  return {static_cast<time_t>(wait_ms / 1000), static_cast<long>(wait_ms % 1000) * 1000000L};
}

}  // namespace

int supervise(const SupervisorOptions& options) {
  Supervision run{options, supervised_signals(), {}};
  if (options.command.empty()) {
    run.log("no command to run");
    return 127;
  }
  if (options.end_with_parent) sigaddset(&run.set, parent_died_signal());
  if (sigprocmask(SIG_BLOCK, &run.set, &run.parent_mask) != 0) throw SysError(errno, "sigprocmask");
  if (options.end_with_parent && prctl(PR_SET_PDEATHSIG, parent_died_signal(), 0, 0, 0) != 0) {
    run.fail("prctl(PR_SET_PDEATHSIG)");
  }
  start_child(&run);
  while (!run.ended) {
    timespec timeout = wait_time(run);
    siginfo_t info{};
    int sig = sigtimedwait(&run.set, &info, &timeout);
    if (sig < 0 && errno != EAGAIN && errno != EINTR) {
      run.log(std::string("sigtimedwait: ") + errno_text(errno));  // the loop still reaps below
    }
    if (options.end_with_parent && sig == parent_died_signal()) {
      run.log("the process that started pod-init died: KILLing the command and what it left");
      kill(run.target, SIGKILL);
      end_children(0);
      sigprocmask(SIG_SETMASK, &run.parent_mask, nullptr);
      return 128 + SIGKILL;
    }
    if (sig > 0 && sig != SIGCHLD) forward(&run, sig, info);
    reap(&run);
    if (!run.ended && options.on_tick) options.on_tick();
    if (!run.ended && run.kill_at != 0 && monotonic_ms() >= run.kill_at) {
      run.log("the command did not end within the grace period: sending KILL");
      if (kill(run.target, SIGKILL) != 0 && errno != ESRCH) {
        run.log(std::string("cannot KILL the command: ") + errno_text(errno));
      }
      run.kill_at = 0;
    }
  }
  sigprocmask(SIG_SETMASK, &run.parent_mask, nullptr);
  return exit_code(run.status);
}

int end_all_processes(unsigned grace_ms, const InitLog& log) {
  auto reap_all = [] {
    int reaped = 0;
    while (waitpid(-1, nullptr, WNOHANG) > 0) ++reaped;
    return reaped;
  };
  auto none_left = [] {
    errno = 0;
    return waitpid(-1, nullptr, WNOHANG) < 0 && errno == ECHILD;
  };
  reap_all();
  if (none_left()) return 0;
  kill(-1, SIGTERM);
  uint64_t deadline = monotonic_ms() + grace_ms;
  while (monotonic_ms() < deadline) {
    reap_all();
    if (none_left()) return 0;
    usleep(10000);
  }
  if (log) log("processes left after the grace period: sending KILL");
  kill(-1, SIGKILL);
  int killed = 0;
  while (waitpid(-1, nullptr, 0) > 0) ++killed;
  return killed;
}

namespace {

// Signals every child of this process (by ppid: not its process group, which
// a setsid daemon leaves) that is not in `skip`, adding it there.
void signal_children(int sig, std::set<pid_t>* skip) {
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return;
  const pid_t self = getpid();
  while (dirent* entry = readdir(proc)) {
    char* end = nullptr;
    long pid = std::strtol(entry->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    std::string stat;
    if (sysfs::read_text("/proc/" + std::string(entry->d_name) + "/stat", &stat) < 0) continue;
    // "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses, so parse after the
    // last ')'.
    size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    long ppid = 0;
    if (std::sscanf(stat.c_str() + close + 1, " %c %ld", &state, &ppid) != 2) continue;
    if (ppid != self || state == 'Z' || !skip->insert(static_cast<pid_t>(pid)).second) continue;
    kill(static_cast<pid_t>(pid), sig);
  }
  closedir(proc);
}

// Reaps what ended; true when no child is left.
bool reap_ended() {
  for (;;) {
    pid_t pid = waitpid(-1, nullptr, WNOHANG);
    if (pid > 0) continue;
    if (pid < 0 && errno == EINTR) continue;
    return pid < 0 && errno == ECHILD;
  }
}

}  // namespace

int end_children(unsigned grace_ms) {
  if (reap_ended()) return 0;
  // Each round signals the children there are now: as one ends, its own
  // children re-parent here (a subreaper) and are signalled the next round.
  std::set<pid_t> signalled;
  const uint64_t kill_at = monotonic_ms() + grace_ms;
  while (monotonic_ms() < kill_at) {
    signal_children(SIGTERM, &signalled);
    usleep(10000);
    if (reap_ended()) return static_cast<int>(signalled.size());
  }
  const uint64_t give_up = monotonic_ms() + kKillWaitMs;
  while (monotonic_ms() < give_up) {
    std::set<pid_t> killed;  // every round: whatever is still a child gets KILL (again)
    signal_children(SIGKILL, &killed);
    signalled.insert(killed.begin(), killed.end());
    if (reap_ended()) break;
    usleep(5000);
  }
  return static_cast<int>(signalled.size());
}

}  // namespace pod_init
