"""``pyinit warm start|status|stop``: a warm interpreter for this user on
this node, holding torch and the preloads imported, that ``pyinit run`` forks
its agent from (``pyinit.run.warm``)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from pyinit import argtypes
from pyinit.errors import EXIT_FAILURE
from pyinit.extras import require
from pyinit.run import preload
from pyinit.run.warm import client, protocol

STOP_WAIT_S = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    kind = parser.get_default("kind")
    if kind == "start":
        parser.add_argument("--preload", default="", metavar="MOD[,MOD...]",
                            help="modules to import besides torch and what a training "
                            "step imports (torch._dynamo)")  # fmt: skip
        parser.add_argument("--idle-timeout", type=argtypes.seconds(1, 7 * 86400, zero=True),
                            default=protocol.DEFAULT_IDLE_TIMEOUT_S, metavar="S",
                            help="end after S seconds without a launch (0: never)")  # fmt: skip
        parser.add_argument("--no-wait", action="store_true",
                            help="return once its socket is bound; the imports go on (a run "
                            "that comes meanwhile waits for them), and what only compiled "
                            "scripts need comes after, between launches")  # fmt: skip
    elif kind == "status":
        parser.add_argument("--json", action="store_true", help="the status as one JSON object")


def main(args: argparse.Namespace) -> int:
    return {"start": _start, "status": _status, "stop": _stop}[args.kind](args)


def _start(args: argparse.Namespace) -> int:
    require("torch", "pyinit warm start")  # what it holds imported: not there, nothing to start
    names = preload.parse(args.preload)
    preload.check_exists(names)
    running = client.request("status")
    if running is not None:
        preloads = ",".join(running["preloads"])
        print(f"pyinit warm: one is running already (pid {running['pid']}, preloads {preloads}); "
              "pyinit warm stop first", file=sys.stderr)  # fmt: skip
        return EXIT_FAILURE
    # Not waited for, it is started for a launch that comes at once (PID 1's
    # command): that launch waits for what every step imports, not for the
    # compile set, as with the one a run starts for itself.
    code, said = client.start(names, args.idle_timeout, wait_ready=not args.no_wait,
                              defer_compile=args.no_wait)  # fmt: skip
    if code:
        print(f"pyinit warm: {said}", file=sys.stderr)
        return code
    if args.no_wait:
        print("pyinit warm: started; its imports go on (pyinit warm status)")
        return 0
    _, pid, seconds = said.split()
    print(f"pyinit warm: ready, pid {pid}, {float(seconds):.2f} s to import "
          f"{','.join(dict.fromkeys((*preload.DEFAULT_PRELOADS, *names)))}")  # fmt: skip
    return 0


def _status(args: argparse.Namespace) -> int:
    answer = client.request("status")
    if answer is None:
        print("pyinit warm: none running", file=sys.stderr)
        return EXIT_FAILURE
    answer.pop("ok", None)
    if args.json:
        print(json.dumps(answer, indent=2))
        return 0
    rows = [("pid", answer["pid"]), ("python", answer["python"]),
            ("preloads", ",".join(answer["preloads"])), ("age", f"{answer['age_s']:.0f} s"),
            ("launches served", answer["launches"]), ("running now", answer["running"]),
            ("resident memory", _mib(answer.get("rss_bytes"))),
            ("proportional memory", _mib(answer.get("pss_bytes"))),
            ("idle timeout", f"{answer['idle_timeout_s']:g} s")]  # fmt: skip
    for name, value in rows:
        print(f"{name:20} {value}")
    return 0


def _mib(value: int | None) -> str:
    return "unknown" if value is None else f"{value / 2**20:.0f} MiB"


def _stop(_args: argparse.Namespace) -> int:
    answer = client.request("stop")
    if answer is None:
        print("pyinit warm: none running")
        return 0
    pid, running = answer["pid"], answer["running"]
    if running:
        print(f"pyinit warm: pid {pid} takes no more launches and ends after its {running} "
              "running one(s)")  # fmt: skip
        return 0
    deadline = time.monotonic() + STOP_WAIT_S
    while time.monotonic() < deadline and client.request("status") is not None:
        time.sleep(0.05)
    print(f"pyinit warm: stopped pid {pid}")
    return 0
