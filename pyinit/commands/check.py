"""``pyinit check``: node health for schedulers, in Nagios exit codes, within a deadline."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict

from pyinit import _native, argtypes
from pyinit.health.check import CRITICAL, STATE_NAMES, UNKNOWN
from pyinit.process_end import exit_now

NAGIOS_STATUS = """\
exit status (a Nagios plugin's, as schedulers' health checks read it):
  0    OK
  1    WARNING: a problem worth a look; the node can take work
  2    CRITICAL: do not schedule on this node (--slurm-drain drains it)
  3    UNKNOWN: a probe could not tell within --deadline, or bad usage"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage_status = UNKNOWN  # Nagios plugins report bad usage as UNKNOWN
    parser.epilog = NAGIOS_STATUS
    argtypes.add_machine_options(parser)
    add = parser.add_argument
    add("--deadline", type=argtypes.seconds(0.1, 600), default=5.0,
        help="seconds for every probe together")  # fmt: skip
    add("--expect-gpus", type=argtypes.whole(0, _native.MAX_EXPECTED_GPUS), metavar="N",
        help="CRITICAL when a different number of GPUs is found")  # fmt: skip
    add("--json", action="store_true", help="the result as one JSON object")
    add("--dev-root", default="/dev", metavar="DIR", help=argparse.SUPPRESS)
    add("--kmsg", default="/dev/kmsg", metavar="PATH",
        help="the kernel log (or a saved dmesg text)")  # fmt: skip
    add("--slurm-drain", action="store_true",
        help="when CRITICAL, drain this node in SLURM with the summary line as the reason "
        "(as HealthCheckProgram or in a prolog)")  # fmt: skip
    add(
        "--slurm-node",
        metavar="NAME",
        help="this node's SLURM name (default: $SLURMD_NODENAME, else the short host name)",
    )


def main(args: argparse.Namespace) -> int:
    from pyinit.health.check import by_precedence, drain, run_probes, summary
    from pyinit.nvml import backend_for

    try:
        args.nvml_backend = backend_for(args)
    except (OSError, ValueError) as e:
        sys.stderr.write(f"pyinit check: {args.nvml_replay}: {e}\n")
        return UNKNOWN
    began = time.monotonic()
    problems, seconds, hung = run_probes(args)
    state, first_line = summary(problems, time.monotonic() - began)
    if args.json:
        document = {"state": STATE_NAMES[state], "exit": state, "summary": first_line,
                    "probe_seconds": seconds,
                    "problems": [asdict(p) for p in problems]}  # fmt: skip
        for problem in document["problems"]:
            problem["state"] = STATE_NAMES[problem["state"]]
        sys.stdout.write(json.dumps(document, indent=1) + "\n")
    else:
        sys.stdout.write(first_line + "\n")
        for problem in by_precedence(problems):
            sys.stdout.write(problem.line() + "\n")
    if args.slurm_drain and state == CRITICAL:
        drain(args.slurm_node, first_line)
    if hung:
        exit_now(state)  # a probe still blocked (in a read, in the driver) must not hold it
    return state
