"""A warm interpreter: torch and the preloads imported once per node and
user, so that ``pyinit run`` forks torchrun's agent from it instead of
starting one that imports them again.

``pyinit warm start`` starts one (``server``); ``pyinit run`` finds it through
a Unix socket in a 0700 folder of its user (``protocol.folder``) and hands it
the launch (``client``): the agent's arguments, the caller's environment,
working directory, umask, resource limits and CPU affinity, and its standard
input, output and error and the rendezvous store's socket as descriptors
(SCM_RIGHTS). The warm interpreter checks the peer's uid (SO_PEERCRED) before
it reads anything, compares the launch with itself (``protocol.Identity``) and
forks a keeper for it, which forks the agent and relays signals and the exit
status; the launch behaves as if ``pyinit run`` had started the agent itself.

A warm interpreter that does not match is not used: the run starts cold and
says why in one line. What must match:

- the interpreter (``sys.executable`` and its version) and the agent's
  ``sys.path``;
- every module file the warm interpreter has loaded, unchanged on disk since;
- uid, gid and supplementary groups; cgroup; the mount, network, PID, IPC,
  UTS, user and cgroup namespaces; capabilities, no_new_privs and seccomp;
- the environment variables read when the interpreter starts or torch is
  imported (:data:`protocol.IMPORT_TIME_PREFIXES` and
  :data:`protocol.IMPORT_TIME_NAMES`): a differing value of another one
  reaches the agent as the caller set it;
- resource limits the warm interpreter can give (each hard limit at least the
  caller's); the caller's limits are then set in the agent;
- every module the run asks to preload.

The rule the warm interpreter keeps, as the agent does before it forks
workers (``pyinit.run.preload``): it never initialises CUDA or opens a
process group, and no thread of its runs when it forks. The compile set that
one started by a run imports after its first launch is imported in a thread
while a keeper forked before it waits for the next launch; nothing is
forked until that thread has ended (``deferred``).
"""
