"""The ``pyinit`` command: lists the commands and dispatches to the one asked
for (``pyinit.commands``, ``pyinit.bench``); the work lives in the subpackages."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from pyinit import bytecode
from pyinit.errors import (
    COMMAND_STATUSES,
    EXIT_FAILURE,
    EXIT_STATUS_HELP,
    EXIT_USAGE,
    PLAIN_STATUSES,
    InputError,
    exit_status_help,
    printable,
)
from pyinit.extras import EXTRAS, MissingExtra, require
from pyinit.termination import Terminated, end_on_signals

if TYPE_CHECKING:
    from pyinit.nvml import NvmlBackend


# Where NVML answers come from; None is the real driver. Tests put a FakeNvml here.
nvml_backend: NvmlBackend | None = None


class _VersionAction(argparse.Action):
    """--version, looked up only when asked for: the package metadata costs
    milliseconds every `pyinit run` would otherwise pay."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any):
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_args: Any) -> None:
        print(f"pyinit {_version()}")  # to stdout, as pod-init --version and every tool do
        parser.exit()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pod-init")
    except PackageNotFoundError:
        return "unknown (not installed)"


# Every command: its module (add_arguments, main) and its line in `pyinit --help`.
# Only the module of the command that runs is imported, so --help and each
# command pay for their own imports alone. A dict is a group (`pyinit bench KIND`).
COMMANDS: dict[str, tuple[str | dict[str, tuple[str, str]], str]] = {
    "topo": ("pyinit.commands.topo", "PCIe topology: matrix, links, BARs, findings"),
    "nvml": ("pyinit.commands.nvml", "NVML's view: NVLinks, P2P status, BAR1, PCIe, memory"),
    "nccl": ("pyinit.commands.nccl", "NCCL topology file, ring graph, env file and hosts lines"),
    "shard": ("pyinit.commands.shard", "JSON Lines or text into token shards for pyinit.data"),
    "run": ("pyinit.commands.run", "preflight, NCCL files, then torchrun on this node"),
    "check": ("pyinit.commands.check",
              "node health for schedulers, Nagios exit codes, a deadline"),
    "warm": ({
        "start": ("pyinit.commands.warm", "start one: torch and the preloads imported, no CUDA"),
        "status": ("pyinit.commands.warm", "its pid, preloads, age, launches served, memory"),
        "stop": ("pyinit.commands.warm", "end it (after the launches it is running)"),
    }, "a warm interpreter per node and user that pyinit run forks its agent from"),
    "timeline": ("pyinit.commands.timeline", "where the seconds went before the first step"),
    "report": ("pyinit.commands.report",
               "where every GPU-hour of a run went: HTML, cost, findings"),
    "monitor": ("pyinit.commands.monitor",
                "GPU utilization, PCIe bandwidth, NVMe latency; alerts"),
    "bench": ({
        "io": ("pyinit.bench.io", "4 KiB random and 1 MiB sequential reads, beside fio"),
        "data": ("pyinit.bench.data", "TokenShardDataset against np.memmap, the sharder"),
        "checkpoint": ("pyinit.bench.checkpoint",
                       "checkpoint.save beside torch.save, safetensors and fio's direct write"),
        "allreduce": ("pyinit.bench.collectives",
                      "all-reduce size sweep in nccl-tests' flags and columns (NCCL or gloo)"),
        "allgather": ("pyinit.bench.collectives", "all-gather, as all_gather_perf"),
        "reducescatter": ("pyinit.bench.collectives", "reduce-scatter, as reduce_scatter_perf"),
        "alltoall": ("pyinit.bench.collectives", "all-to-all, as alltoall_perf"),
        "broadcast": ("pyinit.bench.collectives", "broadcast, as broadcast_perf"),
        "p2p": ("pyinit.bench.copies",
                "GPU-to-GPU copy bandwidth, one way and both ways, every pair"),
        "h2d": ("pyinit.bench.copies", "pinned host memory to and from each GPU"),
    }, "benchmarks: io (fio), data (memmap), checkpoint (torch.save), allreduce and other "
       "collectives (nccl-tests), p2p, h2d"),
}  # fmt: skip


DESCRIPTION = (
    "pod-init's Python side: scans a GPU node, writes its NCCL files, launches "
    "and watches training, checks health, monitors and benchmarks."
)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, exiting with ``usage_status`` on bad usage: 2, or
    what a command sets for itself (check: Nagios' UNKNOWN)."""

    usage_status = EXIT_USAGE

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(self.usage_status, f"{self.prog}: error: {printable(message)}\n")


def _terminal_columns() -> int:
    """shutil.get_terminal_size().columns: COLUMNS, else stdout's terminal, else 80."""
    with contextlib.suppress(KeyError, ValueError):
        if (columns := int(os.environ["COLUMNS"])) > 0:
            return columns
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80
    except (AttributeError, ValueError, OSError):
        return 80


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written, and every option's default in --help (where it
    has one the help text does not already give)."""

    def __init__(self, prog: str) -> None:
        # Given no width, argparse imports shutil (and with it bz2 and lzma) for it:
        # 2-3 ms of every command's start, for every add_argument makes a formatter.
        super().__init__(prog, width=_terminal_columns() - 2)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        unset = default is None or default is False or default in ("", [])
        if unset or default == argparse.SUPPRESS or "default" in text:
            return text
        return f"{text} (default: %(default)s)"


def _first_word(argv: list[str], names: Mapping[str, object]) -> str | None:
    """The command argv names (its first word that is not an option), if any."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in names else None


def _subcommands(parser: argparse.ArgumentParser, table: Mapping[str, tuple[Any, str]],
                 argv: list[str], dest: str, prefix: str) -> _Parser | None:  # fmt: skip
    """The subparser argv chooses, made whole, and that one returned; a
    subparser for every name in the table (for the list in --help and
    usage errors) when argv chooses none, and None."""
    sub = parser.add_subparsers(dest=dest, required=True, metavar=dest.upper(),
                                parser_class=_Parser)  # fmt: skip
    chosen = _first_word(argv, table)
    made = None
    for name, (target, text) in table.items():
        if chosen is not None and name != chosen:
            continue  # argparse's parsers cost a millisecond each: a plan on 512 nodes feels it
        statuses = exit_status_help(*COMMAND_STATUSES.get(name, PLAIN_STATUSES))
        command = sub.add_parser(name, help=text, description=text, epilog=statuses,
                                 formatter_class=_Formatter)  # fmt: skip
        if name != chosen:
            continue
        rest = argv[argv.index(name) + 1 :]
        if isinstance(target, dict):
            made = _subcommands(command, target, rest, "kind", f"{prefix} {name}")
        else:
            made = _attach(command, target, name, f"{prefix} {name}")
    return made


def _attach(parser: _Parser, module_name: str, name: str, command: str) -> _Parser:
    """The command's own options and handler, from its module, imported now.
    A module that serves several commands reads its name as the ``kind`` default."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name not in EXTRAS:
            raise
        require(e.name, command)
        raise
    parser.set_defaults(kind=name)
    module.add_arguments(parser)
    parser.set_defaults(handler=module.main)
    return parser


def build_parser(argv: list[str]) -> tuple[_Parser, _Parser | None]:
    """The whole `pyinit` parser with the command argv names made whole (the
    others listed by name and help line), and that command's parser."""
    parser = _Parser(prog="pyinit", description=DESCRIPTION, epilog=EXIT_STATUS_HELP,
                     formatter_class=_Formatter)  # fmt: skip
    parser.add_argument("--version", action=_VersionAction, help="print the version and exit")
    return parser, _subcommands(parser, COMMANDS, argv, "command", "pyinit")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        cache = bytecode.use()  # before any import it could serve
    except InputError as e:
        print(f"pyinit: {printable(str(e))}", file=sys.stderr)
        return EXIT_USAGE
    # The two commands whose every run reads NVML (the run's preflight): its
    # driver's start overlaps their imports and parsing.
    word = _first_word(argv, COMMANDS)
    early_nvml = None
    if (
        nvml_backend is None
        and word in ("check", "run")
        and not any(a.startswith("--nvml-replay") for a in argv)
    ):
        from pyinit import nvml as early_nvml

        early_nvml.begin_driver_init()
    try:
        if word not in OWN_SIGNALS:
            end_on_signals()
        parser, command = build_parser(argv)
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # said by the command's parser, so its usage and exit status
            (command or parser).error(f"unrecognized arguments: {' '.join(unknown)}")
        args.nvml_backend = nvml_backend
        status = args.handler(args)
        sys.stdout.flush()
        if cache is not None:
            bytecode.fill_missing()
        else:
            bytecode.keep_imported()
        return status
    except KeyboardInterrupt:
        print("pyinit: interrupted", file=sys.stderr)
        return 130
    except Terminated as e:  # its cleanup has run; run_cli ends the process by the signal
        print(f"pyinit: {e}", file=sys.stderr)
        raise
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
    finally:
        if early_nvml is not None:
            early_nvml.end_driver_init()


# Commands run often and timed end to end (a scheduler's health check every few
# seconds, `pyinit nccl` and `pyinit topo` in a job's prolog) that leave nothing
# to tear down when they return: they end without Python unwinding every module.
ENDS_AT_ONCE = frozenset({"check", "nccl", "topo"})
# The commands that take SIGTERM and SIGHUP themselves: run's supervisor
# forwards them to the workers, a warm interpreter serves through them. Every
# other command ends on them with its cleanup done (pyinit.termination).
OWN_SIGNALS = frozenset({"run", "warm"})


def _fill_closed_stdio() -> None:
    """A process started with stdin, stdout or stderr closed (`pyinit check
    >&-`) has no stream there in Python, and the first print would raise
    mid-command; worse, the next file it opened would take that number and
    receive what is printed. Each is /dev/null instead, and a closed stdout
    is said in one line: the command still does its work and returns its
    status (a health check's is what a scheduler reads)."""
    closed = [name for name in ("stdin", "stdout", "stderr") if getattr(sys, name) is None]
    for number, name in enumerate(("stdin", "stdout", "stderr")):
        if name not in closed:
            continue
        opened = os.open(os.devnull, os.O_RDWR)
        if opened == number:
            # os.open's descriptors are closed on exec, and what this one stands
            # in for must reach the programs `run` starts.
            os.set_inheritable(number, True)
        else:
            os.dup2(opened, number)
            os.close(opened)
        setattr(sys, name, open(number, "r" if number == 0 else "w", closefd=False))  # noqa: SIM115
    if "stdout" in closed and "stderr" not in closed:
        print("pyinit: stdout is closed; what the command prints there is discarded",
              file=sys.stderr)  # fmt: skip


def run_cli() -> int:
    """The console script: main(), and for what no handler expected (a bug)
    its traceback and one line asking for a report."""
    try:
        _fill_closed_stdio()
        # A file's name goes out as its bytes, as coreutils print one, whatever the
        # locale's handler: a name that is not UTF-8 never ends a command.
        sys.stdout.reconfigure(errors="surrogateescape")  # type: ignore[union-attr]
        status = main()
        if _first_word(sys.argv[1:], COMMANDS) in ENDS_AT_ONCE:
            from pyinit.process_end import exit_now

            exit_now(status)
        return status
    except Terminated as e:
        from pyinit.process_end import flush_stdio

        flush_stdio()
        e.end_by_it()
    except Exception:
        import traceback  # a bug's path alone: not every command's start

        traceback.print_exc()
        print(f"pyinit: this is a bug in pod-init {_version()}; please report it with the "
              "traceback above", file=sys.stderr)  # fmt: skip
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(run_cli())
