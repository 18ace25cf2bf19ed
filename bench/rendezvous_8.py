"""Eight nodes' rendezvous: from starting the launchers to every rank joined.

Eight network namespaces on a bridge (as the tests make them), a worker on
each; `pyinit run --hostfile` against plain `torchrun` with the same static
rendezvous (--nnodes 8 --node-rank K --master-addr node 0, and
GLOO_SOCKET_IFNAME=eth0 set by hand, which pyinit run works out itself),
interleaved round by round. The script joins a gloo process group, passes a barrier and prints
when (CLOCK_BOOTTIME); the figure is the last rank's time minus the launch.
Root only.

    python bench/rendezvous_8.py --rounds 3 --out DIR
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
from conftest import namespaces, node_addresses  # noqa: E402

from pyinit.jsonfile import write_json  # noqa: E402

SCRIPT = """
import time
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
print("joined", time.clock_gettime(time.CLOCK_BOOTTIME), flush=True)
"""
COUNT = 8


def launch(tool: str, names: list[str], folder: Path, port: int) -> float:
    """Seconds from the launch to the last rank joined."""
    script = folder / "join.py"
    script.write_text(SCRIPT)
    hostfile = folder / "hosts"
    hostfile.write_text("\n".join(node_addresses(COUNT)) + "\n")
    bin_dir = Path(sys.executable).parent
    began = time.clock_gettime(time.CLOCK_BOOTTIME)
    procs = []
    for rank, ns in enumerate(names):
        if tool == "pyinit run":
            run_dir = folder / f"run-{port}-{rank}"
            command = [str(bin_dir / "pyinit"), "run", "--hostfile", str(hostfile),
                       "--nproc-per-node", "1", "--master-port", str(port), "--monitor-interval",
                       "0", "--run-dir", str(run_dir), "--", str(script)]  # fmt: skip
        else:
            command = [str(bin_dir / "torchrun"), "--nnodes", str(COUNT), "--node-rank", str(rank),
                       "--nproc-per-node", "1", "--master-addr", node_addresses(COUNT)[0],
                       "--master-port", str(port), str(script)]  # fmt: skip
        # Plain torchrun's gloo would bind to the host name's address (127.0.0.1
        # here) and never connect: the interface is given by hand, as a user must.
        # pyinit run as launched cold, with no warm interpreter left behind: the
        # rendezvous is what is timed, and the eight nodes share one machine's /tmp.
        env = ({**os.environ, "GLOO_SOCKET_IFNAME": "eth0"} if tool == "torchrun"
               else {**os.environ, "PYINIT_WARM": "off"})  # fmt: skip
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns, *command], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))  # fmt: skip
    joined = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            raise RuntimeError(f"{tool}: a node did not finish in 300 s") from None
        if proc.returncode != 0:
            raise RuntimeError(f"{tool} failed: {out[-2000:]}")
        joined += [float(line.split()[1]) for line in out.splitlines() if line.startswith("joined")]
    if len(joined) != COUNT:
        raise RuntimeError(f"{tool}: {len(joined)} of {COUNT} ranks joined")
    return max(joined) - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=".", metavar="DIR", help="folder for rendezvous_8.json")
    parser.add_argument("--torchrun-first", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    tools = ["torchrun", "pyinit run"] if args.torchrun_first else ["pyinit run", "torchrun"]
    times: dict[str, list[float]] = {tool: [] for tool in tools}
    with namespaces(COUNT) as names, tempfile.TemporaryDirectory() as tmp:
        port = 29700
        for round_no in range(args.rounds):
            for tool in tools if round_no % 2 == 0 else tools[::-1]:
                port += 2  # a fresh port each run: no TIME_WAIT to meet
                times[tool].append(launch(tool, names, Path(tmp), port))
                print(f"round {round_no} {tool}: {times[tool][-1]:.2f} s", file=sys.stderr)
    medians = {tool: statistics.median(values) for tool, values in times.items()}
    print(f"{'launcher':12} {'median s':>9} {'min s':>7}")
    for tool in tools:
        print(f"{tool:12} {medians[tool]:9.2f} {min(times[tool]):7.2f}")
    print(f"pyinit run / torchrun: {medians['pyinit run'] / medians['torchrun']:.2f}")
    write_json(Path(args.out) / "rendezvous_8.json",
               {"date": time.strftime("%Y-%m-%d"), "nodes": COUNT,
                "rounds": args.rounds, "seconds": times})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
