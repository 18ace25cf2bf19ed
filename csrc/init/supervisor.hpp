// Running the workload the way an init must: the command as a child, every
// process that ends reaped (the command's and the orphans that re-parent
// here), termination signals forwarded, and a grace period after which a
// command that ignores them is killed. As the machine's init, the shutdown
// that follows: every remaining process signalled (TERM, grace, KILL).
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

namespace pod_init {

using InitLog = std::function<void(const std::string&)>;

struct SupervisorOptions {
  std::vector<std::string> command;
  // "KEY=VALUE" entries for the command; empty: it inherits ours.
  std::vector<std::string> environment;
  unsigned grace_ms = 10000;  // after a forwarded TERM or INT, then KILL
  InitLog log;                // one line per event worth telling
  // Each signal, before it is forwarded to the command. False: the signal is
  // the caller's own (sent to end the command, and said by the caller), so no
  // line calls it forwarded.
  std::function<bool(int)> on_signal;
  // Called at least every tick_ms while the command runs (0: not at all): the
  // caller's own watch (pyinit run counts restarts there).
  std::function<void()> on_tick;
  unsigned tick_ms = 0;
  // Sent to the command when this process dies, even by KILL (PR_SET_PDEATHSIG);
  // 0: none. pyinit run sets it so nothing outlives a killed supervisor.
  int parent_death_signal = 0;
  // tini's -g: the command leads a process group of its own (and the terminal's
  // foreground, when stdin is one), and signals go to the whole group.
  bool process_group = false;
  // tini's -v: a line for every signal forwarded and every process reaped.
  bool verbose = false;
  // When the process that started this one dies, even by KILL: the command
  // and every process it left are KILLed at once and supervise() returns 137.
  // As a subreaper the supervisor then holds every orphan of the command, so
  // nothing outlives its starter (pyinit run runs its workload under it).
  bool end_with_parent = false;
};

// The command's exit code: its status, 128 + the signal that killed it, 127
// when it was not found, 126 when it could not be executed. Not PID 1: the
// caller should be a child subreaper (become_subreaper) so orphans come here.
// Signals are taken with sigtimedwait: a multi-threaded caller must block them
// in every thread beforehand, or another thread takes them; the command starts
// with them unblocked whatever the caller's mask.
int supervise(const SupervisorOptions& options);

// PR_SET_CHILD_SUBREAPER. Returns 0 or -errno.
int become_subreaper();

// What ps, top and pkill -f read for this process (/proc/self/cmdline):
// `arguments` after the program's own name, written over the command line the
// process was started with (a forked child inherits its parent's). The name
// stays, as libc's program_invocation_name points into it. Cut where that
// line's memory ends: growing it would take the environment's place. Returns
// the bytes now shown (the name and every NUL included) or -errno.
int set_arguments_shown(const std::vector<std::string>& arguments);

// The IO priority of process `pid` (0: this one) as ioprio_get(2) gives it
// (the class in bits 13-15, the level below), or -errno (ESRCH when there is
// no such process). Python has no call for it.
int io_priority(pid_t pid = 0);

// Sets this process's IO priority (a value io_priority() gave). Returns 0 or
// -errno (EPERM for the real-time class without CAP_SYS_NICE or
// CAP_SYS_ADMIN, EINVAL for a value of no class).
int set_io_priority(int priority);

// Asks the kernel to send `signal` to this process when its parent dies
// (PR_SET_PDEATHSIG), then checks the parent is still `parent`: if it died
// before the request, the signal is raised now. Returns 0 or -errno.
int die_with_parent(int signal, pid_t parent);

// Ends every process that is still a child of this one, orphans that
// re-parent here as their parents end included (a subreaper's descendants):
// TERM, up to `grace_ms` for them to end, then KILL, everything reaped. A
// process that not even KILL ends (stuck in the kernel) is waited for at most
// a few seconds more. Returns how many processes were signalled.
int end_children(unsigned grace_ms = 0);

// As init at shutdown: TERM to every process, `grace_ms` for them to end
// (reaping), KILL to the rest, reaped. Returns how many were killed.
int end_all_processes(unsigned grace_ms, const InitLog& log);

}  // namespace pod_init
