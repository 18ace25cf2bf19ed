// Running the workload the way an init must: the command as a child, every
// process that ends reaped (the command's and the orphans that re-parent
// here), termination signals forwarded, and a grace period after which a
// command that ignores them is killed. As the machine's init, the shutdown
// that follows: every remaining process signalled (TERM, grace, KILL).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace pod_init {

using InitLog = std::function<void(const std::string&)>;

struct SupervisorOptions {
  std::vector<std::string> command;
  unsigned grace_ms = 10000;  // after a forwarded TERM or INT, then KILL
  InitLog log;                // one line per event worth telling
  // Called in the child between fork and exec (for example to set the environment).
  std::function<void()> before_exec;
};

// The command's exit code: its status, 128 + the signal that killed it, 127
// when it was not found, 126 when it could not be executed. Not PID 1: the
// caller should be a child subreaper (become_subreaper) so orphans come here.
int supervise(const SupervisorOptions& options);

// PR_SET_CHILD_SUBREAPER. Returns 0 or -errno.
int become_subreaper();

// As init at shutdown: TERM to every process, `grace_ms` for them to end
// (reaping), KILL to the rest, reaped. Returns how many were killed.
int end_all_processes(unsigned grace_ms, const InitLog& log);

}  // namespace pod_init
