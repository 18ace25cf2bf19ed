"""``pyinit nccl``: NCCL's topology file, ring graph, env file and hosts
lines, and with ``--tune`` the settings measured to beat NCCL's defaults."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pyinit import _native, argtypes
from pyinit.errors import EXIT_FAILURE, InputError, as_utf8

if TYPE_CHECKING:
    from pyinit.nccl.tuning import Tuning
    from pyinit.nvml import NvmlView
    from pyinit.topology import Topology


def _name(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    argtypes.add_machine_options(parser)
    add = parser.add_argument
    add("--hints", metavar="FILE", help="regroup devices under switches/NUMA nodes")
    add("--hostfile", metavar="FILE", help="one IP address per node, node 0 first")
    add("--node", type=argtypes.whole(0, _native.MAX_HOSTS - 1), metavar="K",
        help="write node K's files (of the hostfile, with this topology): a plan for a "
        "cluster of such nodes")  # fmt: skip
    add("--out", default=".", metavar="DIR", help="where the files go")
    add("--force-rings", action="store_true", help="make NCCL use the computed rings unchecked")
    add("--socket-ifname", type=_name, metavar="NAME", help="interface for NCCL's sockets")
    add("--channels", type=argtypes.whole(1, _native.MAX_CHANNELS), metavar="N",
        help="ring channels in the graph")  # fmt: skip
    add("--no-dns", action="store_true", help="host names in the hostfile are an error")
    add("--tune", action="store_true",
        help="measure what beats NCCL's defaults on this node (cached per kind of node): a "
        "table for pod-init's tuner plugin, settings in nccl.env")  # fmt: skip
    add("--retune", action="store_true", help="--tune, measuring even when cached")
    add("--tune-budget", type=argtypes.seconds(5, 3600), default=45.0, metavar="S",
        help="seconds of timing for --tune (torchrun's start comes on top)")  # fmt: skip
    add("--cache", metavar="DIR", help="tuning cache (default $POD_INIT_CACHE/nccl-tuning, "
        "else /var/cache/pod-init/nccl-tuning)")  # fmt: skip
    add("--proc-root", default="/proc", metavar="DIR",
        help="whose cpuinfo names the CPU in nccl-topo.xml (with a fixture: its own, or an "
        "empty folder to leave the CPU to NCCL)")  # fmt: skip


def main(args: argparse.Namespace) -> int:
    from pyinit.nccl import configure

    if args.tune or args.retune:
        measured = _tune(args)
        if measured is None:
            return EXIT_FAILURE
        topology, tuning, nvml = measured
    elif args.no_nvml:  # NVML's module not even imported: a plan on every node of a job
        topology, tuning, nvml = None, None, None
    else:
        from pyinit.nvml import optional_view

        topology, tuning, nvml = None, None, optional_view(args)
    config = configure(args.sysfs_root, topology=topology, tuning=tuning, hints=args.hints,
                       hostfile=args.hostfile, out_dir=args.out, socket_ifname=args.socket_ifname,
                       force_rings=args.force_rings, channels=args.channels, nvml=nvml,
                       proc_root=args.proc_root, dns=not args.no_dns, node=args.node)  # fmt: skip
    config.write()
    sys.stdout.write(as_utf8(config.summary()))
    if tuning is not None:
        from pyinit.nccl.tuning import plot_tuning

        sys.stdout.write(tuning.to_text())
        plot_tuning(tuning, Path(config.out_dir) / "nccl-tuning.png")
    return 0


def _tune(args: argparse.Namespace) -> tuple[Topology, Tuning, NvmlView] | None:
    """The scan, the tuning (measured, or from the cache) and NVML's view;
    None when the measurement failed (said on stderr)."""
    from pyinit.extras import require
    from pyinit.nccl import tune
    from pyinit.nccl.measure import MeasurementFailed
    from pyinit.nccl.tuning_cache import cache_dir
    from pyinit.nvml import NvmlUnavailable, backend_for, read_nvml
    from pyinit.topology import scan

    require("torch", "pyinit nccl --tune")
    if args.no_nvml:
        raise InputError("--tune measures NCCL on this node's GPUs: it needs NVML, not --no-nvml")
    try:
        nvml = read_nvml(backend_for(args))
    except NvmlUnavailable as e:
        raise InputError(f"--tune measures NCCL on this node's GPUs: NVML is "
                         f"unavailable ({e})") from None  # fmt: skip
    topology = scan(args.sysfs_root, probe_bar0=False)
    cache = Path(args.cache) if args.cache else cache_dir()
    try:
        tuning, reused = tune(topology, nvml, cache=cache, retune=args.retune,
                              budget=args.tune_budget)  # fmt: skip
    except MeasurementFailed as e:
        print(f"pyinit nccl: {e}", file=sys.stderr)
        return None
    if reused:
        print(f"pyinit nccl: tuning from {cache / tuning.key.id}.json (measured before on this "
              "kind of node; --retune measures again)", file=sys.stderr)  # fmt: skip
    return topology, tuning, nvml
