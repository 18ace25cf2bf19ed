"""The ``pyinit`` command: parses arguments and dispatches; the work lives in
the subpackages."""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyinit import _native, argtypes
from pyinit.errors import EXIT_FAILURE, EXIT_STATUS_HELP, EXIT_USAGE, InputError, printable
from pyinit.extras import MissingExtra
from pyinit.run import config as run_config

if TYPE_CHECKING:
    from pyinit.nvml import NvmlBackend, NvmlView


# Where NVML answers come from; None is the real driver. Tests put a FakeNvml here.
nvml_backend: NvmlBackend | None = None


class _VersionAction(argparse.Action):
    """--version, looked up only when asked for: the package metadata costs
    milliseconds every `pyinit run` would otherwise pay."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any):
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_args: Any) -> None:
        parser.exit(message=f"pyinit {_version()}\n")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pod-init")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _name(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def _nvml_backend(args: argparse.Namespace) -> NvmlBackend | None:
    """A recorded NVML (--nvml-replay FILE, from `pyinit nvml --record`), the
    one a test installed, or None for the real driver."""
    replay = getattr(args, "nvml_replay", None)
    if replay is None:
        return nvml_backend
    from pyinit.nvml import load_replay

    return load_replay(replay)


def _read_nvml(args: argparse.Namespace) -> NvmlView | None:
    """NVML's view, or None with a line on stderr saying why not."""
    from pyinit.nvml import NvmlUnavailable, read_nvml

    if args.no_nvml:
        return None
    try:
        return read_nvml(_nvml_backend(args))
    except NvmlUnavailable as e:
        print(f"pyinit: NVML unavailable ({e}); working from sysfs alone", file=sys.stderr)
        return None


def _cmd_topo(args: argparse.Namespace) -> int:
    from pyinit.topology import scan

    nvml = _read_nvml(args)
    topo = scan(args.sysfs_root, args.expect_gpus, not args.no_bar0, nvml=nvml)
    if args.json:
        document = json.loads(topo.to_json())
        document["nvml"] = nvml.to_dict() if nvml else None
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        sys.stdout.write(topo.to_text() + ("\n" + nvml.to_text() if nvml else ""))
    return EXIT_FAILURE if topo.has_errors else 0


def _cmd_nvml(args: argparse.Namespace) -> int:
    from pyinit.nvml import FakeNvml, NvmlUnavailable, PynvmlBackend, read_nvml

    backend = _nvml_backend(args) or PynvmlBackend()
    try:
        if args.record:
            sys.stdout.write(json.dumps(FakeNvml.record(backend), indent=1) + "\n")
            return 0
        view = read_nvml(backend)
    except NvmlUnavailable as e:
        print(f"pyinit: NVML unavailable: {e}", file=sys.stderr)
        return EXIT_FAILURE
    sys.stdout.write(json.dumps(view.to_dict(), indent=2) + "\n" if args.json else view.to_text())
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    import importlib

    from pyinit.extras import require

    if args.kind != "io":
        require("torch", f"pyinit bench {args.kind}")

    if args.kind in ("p2p", "h2d"):
        from pyinit.bench import copies

        return copies.main(args.options, args.kind)
    if args.kind in ("io", "data", "checkpoint"):
        return importlib.import_module(f"pyinit.bench.{args.kind}").main(args.options)
    from pyinit.bench import collectives

    return collectives.main(args.options, args.kind)


def _cmd_nccl(args: argparse.Namespace) -> int:
    from pyinit.nccl import configure

    topology = tuning = None
    if args.tune or args.retune:
        from pyinit.extras import require
        from pyinit.nccl import tune
        from pyinit.nccl.measure import MeasurementFailed
        from pyinit.nccl.tuning import cache_dir, plot_tuning
        from pyinit.nvml import NvmlUnavailable, read_nvml
        from pyinit.topology import scan

        require("torch", "pyinit nccl --tune")
        if args.no_nvml:
            raise InputError("--tune measures NCCL on this node's GPUs: it needs NVML, "
                             "not --no-nvml")  # fmt: skip
        try:
            nvml = read_nvml(_nvml_backend(args))
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
            return EXIT_FAILURE
        if reused:
            print(f"pyinit nccl: tuning from {cache / tuning.key.id}.json (measured before on "
                  "this kind of node; --retune measures again)", file=sys.stderr)  # fmt: skip
    else:
        nvml = _read_nvml(args)
    config = configure(
        args.sysfs_root,
        topology=topology,
        tuning=tuning,
        hints=args.hints,
        hostfile=args.hostfile,
        out_dir=args.out,
        socket_ifname=args.socket_ifname,
        force_rings=args.force_rings,
        channels=args.channels,
        nvml=nvml,
        proc_root=args.proc_root,
        dns=not args.no_dns,
        node=args.node,
    )
    config.write()
    sys.stdout.write(config.summary())
    if tuning is not None:
        sys.stdout.write(tuning.to_text())
        plot_tuning(tuning, Path(config.out_dir) / "nccl-tuning.png")
    return 0


def _cmd_shard(args: argparse.Namespace) -> int:
    from pyinit.data.sharder import shard

    summary = shard(
        args.inputs,
        args.out,
        args.shards,
        text_field=args.field,
        tokenizer=args.tokenizer,
        fmt=args.format,
        skip_invalid=args.skip_invalid,
        force=args.force,
        progress=None if args.quiet else sys.stderr,
    )
    sys.stdout.write(summary.to_text())
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from pyinit.run.launcher import run

    return run(run_config.config_from_args(args), nvml_backend)


def _cmd_check(args: argparse.Namespace) -> int:
    from pyinit.health import check

    return check.main(args.options, nvml_backend)


def _cmd_timeline(args: argparse.Namespace) -> int:
    from pyinit.run import timeline

    return timeline.main(args.options)


def _cmd_report(args: argparse.Namespace) -> int:
    from pyinit.run import report

    return report.main(args.options)


def _cmd_monitor(args: argparse.Namespace) -> int:
    from pyinit import monitor

    return monitor.main(args, nvml_backend)


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written, and every option's default in --help (where it
    has one the help text does not already give)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if default is None or default is False or default == argparse.SUPPRESS or "default" in text:
            return text
        return f"{text} (default: %(default)s)"


def _command(sub: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    return sub.add_parser(name, formatter_class=_Formatter, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pyinit",
        description="pod-init supervisor",
        epilog=EXIT_STATUS_HELP,
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action=_VersionAction, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    machine = argtypes.machine_options()
    topo = _command(sub, "topo", help="PCIe topology: matrix, links, BARs, findings",
                    parents=[machine])  # fmt: skip
    topo.add_argument("--json", action="store_true", help="print one JSON object")
    topo.add_argument("--expect-gpus", type=argtypes.whole(0, _native.MAX_EXPECTED_GPUS),
                      metavar="N", help="an error finding when fewer GPUs are found")  # fmt: skip
    topo.add_argument("--no-bar0", action="store_true", help="do not map GPU BAR0")
    topo.set_defaults(handler=_cmd_topo)

    nvml = _command(sub, "nvml", help="NVML's view: NVLinks, P2P status, BAR1, PCIe, memory")
    nvml.add_argument("--nvml-replay", metavar="FILE", help=argtypes.REPLAY_HELP)
    nvml.add_argument("--json", action="store_true", help="print one JSON object")
    nvml.add_argument(
        "--record", action="store_true", help="print every NVML answer, replayable by FakeNvml"
    )
    nvml.set_defaults(handler=_cmd_nvml)

    nccl = _command(sub, "nccl", parents=[machine],
                    help="NCCL topology file, ring graph, env file and hosts lines")  # fmt: skip
    nccl.add_argument("--hints", metavar="FILE", help="regroup devices under switches/NUMA nodes")
    nccl.add_argument("--hostfile", metavar="FILE", help="one IP address per node, node 0 first")
    nccl.add_argument("--node", type=argtypes.whole(0, _native.MAX_HOSTS - 1), metavar="K",
                      help="write node K's files (of the hostfile, with this topology): a plan "
                      "for a cluster of such nodes")  # fmt: skip
    nccl.add_argument("--out", default=".", metavar="DIR", help="where the files go (default .)")
    nccl.add_argument(
        "--force-rings", action="store_true", help="make NCCL use the computed rings unchecked"
    )
    nccl.add_argument(
        "--socket-ifname", type=_name, metavar="NAME", help="interface for NCCL's sockets"
    )
    nccl.add_argument(
        "--channels",
        type=argtypes.whole(1, _native.MAX_CHANNELS),
        metavar="N",
        help="ring channels in the graph",
    )
    nccl.add_argument(
        "--no-dns", action="store_true", help="host names in the hostfile are an error"
    )
    nccl.add_argument("--tune", action="store_true",
                      help="measure what beats NCCL's defaults on this node (cached per "
                      "kind of node): a table for pod-init's tuner plugin, settings in "
                      "nccl.env")  # fmt: skip
    nccl.add_argument("--retune", action="store_true", help="--tune, measuring even when cached")
    nccl.add_argument("--tune-budget", type=argtypes.seconds(5, 3600), default=45.0, metavar="S",
                      help="seconds of timing for --tune (torchrun's start comes on "
                      "top)")  # fmt: skip
    nccl.add_argument("--cache", metavar="DIR",
                      help="tuning cache (default $POD_INIT_CACHE/nccl-tuning, else "
                      "/var/cache/pod-init/nccl-tuning)")  # fmt: skip
    nccl.add_argument("--proc-root", default="/proc", metavar="DIR", help=argparse.SUPPRESS)
    nccl.set_defaults(handler=_cmd_nccl)

    shard = _command(sub, "shard", help="JSON Lines or text into token shards for pyinit.data")
    shard.add_argument("inputs", nargs="+", metavar="INPUT", help=".jsonl or text, may be .gz")
    shard.add_argument("--out", required=True, metavar="DIR", help="where the shards go")
    shard.add_argument("--shards", required=True, type=argtypes.whole(1, 65536), metavar="N",
                       help="how many shard files")  # fmt: skip
    shard.add_argument("--field", default="text", help="the JSON field holding the text")
    shard.add_argument(
        "--tokenizer",
        default="byte",
        metavar="byte|PATH",
        help="byte (built in) or a tokenizer.json",
    )
    shard.add_argument("--format", default="jsonl", choices=("jsonl", "text"), help="input lines")
    shard.add_argument(
        "--skip-invalid", action="store_true", help="count and skip bad lines instead of stopping"
    )
    shard.add_argument("--force", action="store_true", help="replace shards already in --out")
    shard.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    shard.set_defaults(handler=_cmd_shard)

    run = _command(sub, "run", help="preflight, NCCL files, then torchrun on this node")
    run_config.add_arguments(run)
    run.set_defaults(handler=_cmd_run)

    check = sub.add_parser(
        "check", add_help=False, help="node health for schedulers, Nagios exit codes, a deadline"
    )
    check.set_defaults(handler=_cmd_check, takes_options=True)
    timeline = sub.add_parser(
        "timeline", add_help=False, help="where the seconds went before the first step"
    )
    timeline.set_defaults(handler=_cmd_timeline, takes_options=True)
    report = sub.add_parser(
        "report", add_help=False, help="where every GPU-hour of a run went: HTML, cost, findings"
    )
    report.set_defaults(handler=_cmd_report, takes_options=True)

    mon = _command(sub, "monitor", help="GPU utilization, PCIe bandwidth, NVMe latency; alerts")
    mon.add_argument("--interval", type=argtypes.seconds(0.1, 3600), default=5.0, metavar="S",
                     help="seconds between samples")  # fmt: skip
    mon.add_argument("--once", action="store_true",
                     help="one sample (a table, or JSON with --json), then exit")  # fmt: skip
    mon.add_argument("--json", action="store_true",
                     help="JSON Lines on stdout instead of the live table")  # fmt: skip
    mon.add_argument("--out", metavar="FILE", help="append JSON Lines to FILE")
    mon.add_argument(
        "--prometheus", metavar="HOST:PORT", help="serve /metrics (e.g. 127.0.0.1:9400)"
    )
    mon.add_argument(
        "--textfile", metavar="PATH", help="node_exporter textfile, replaced atomically"
    )
    mon.add_argument(
        "--webhook", metavar="URL", help="Alertmanager-style alerts, firing and resolved"
    )
    mon.add_argument("--webhook-header", action="append", metavar="'NAME: VALUE'",
                     help="an HTTP header for the webhook (repeatable; never logged)")  # fmt: skip
    mon.add_argument(
        "--thresholds", metavar="FILE", help="JSON: gpu_util_low, nvme_read_latency_us..."
    )
    mon.add_argument("--count", type=argtypes.whole(0, 1 << 30), default=0, help=argparse.SUPPRESS)
    mon.add_argument("--sys-block", default="/sys/block", help=argparse.SUPPRESS)
    mon.set_defaults(handler=_cmd_monitor)

    bench = _command(
        sub,
        "bench",
        help="benchmarks: io (fio), data (memmap), checkpoint (torch.save), allreduce and other "
        "collectives (nccl-tests), p2p, h2d",
    )
    kinds = bench.add_subparsers(dest="kind", required=True, metavar="KIND")
    io = kinds.add_parser("io", help="4 KiB random and 1 MiB sequential reads, beside fio",
                          add_help=False)  # fmt: skip
    io.set_defaults(handler=_cmd_bench, takes_options=True)
    loader = kinds.add_parser("data", help="TokenShardDataset against np.memmap, the sharder",
                              add_help=False)  # fmt: skip
    loader.set_defaults(handler=_cmd_bench, takes_options=True)
    saves = kinds.add_parser("checkpoint", help="checkpoint.save beside torch.save, safetensors "
                             "and fio's direct write", add_help=False)  # fmt: skip
    saves.set_defaults(handler=_cmd_bench, takes_options=True)
    for kind, text in (
        ("allreduce", "all-reduce size sweep in nccl-tests' flags and columns (NCCL or gloo)"),
        ("allgather", "all-gather, as all_gather_perf"),
        ("reducescatter", "reduce-scatter, as reduce_scatter_perf"),
        ("alltoall", "all-to-all, as alltoall_perf"),
        ("broadcast", "broadcast, as broadcast_perf"),
        ("p2p", "GPU-to-GPU copy bandwidth, one way and both ways, every pair"),
        ("h2d", "pinned host memory to and from each GPU"),
    ):
        kinds.add_parser(kind, help=text, add_help=False).set_defaults(
            handler=_cmd_bench, takes_options=True
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # `pyinit bench io ...` hands everything after its name to the benchmark's own parser.
    args, options = parser.parse_known_args(argv)
    if options and not getattr(args, "takes_options", False):
        parser.error(f"unrecognized arguments: {' '.join(options)}")
    args.options = options
    try:
        status = args.handler(args)
        sys.stdout.flush()
        return status
    except KeyboardInterrupt:
        print("pyinit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader left (`pyinit topo | head`); silence the flush at exit too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILURE
    except MissingExtra as e:
        print(f"pyinit: {printable(str(e))}", file=sys.stderr)
        return EXIT_USAGE
    except InputError as e:
        # It names the option, or the file and line, already. Any other ValueError
        # is a bug: it stays a traceback, with the line below.
        print(f"pyinit: {printable(str(e))}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        print(f"pyinit: {printable(f'{where}{e.strerror or e}')}", file=sys.stderr)
        return EXIT_FAILURE


def run_cli() -> int:
    """The console script: main(), and for what no handler expected (a bug)
    its traceback and one line asking for a report."""
    try:
        return main()
    except Exception:
        traceback.print_exc()
        print(f"pyinit: this is a bug in pod-init {_version()}; please report it with the "
              "traceback above", file=sys.stderr)  # fmt: skip
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(run_cli())
