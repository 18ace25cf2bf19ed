"""Preloaded by the agent: an atexit function of the agent's own, which
notes the process that runs it (the agent's, never a forked worker's)."""

import atexit
import os


def note_pid() -> None:
    with open(os.environ["AGENT_EXIT_NOTES"], "a") as f:
        f.write(f"{os.getpid()}\n")


atexit.register(note_pid)
