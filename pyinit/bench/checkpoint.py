"""Checkpoints to and from the device, beside the tools people use and the
disk's own ceiling, interleaved in one run:

- saves of a state dict on ``--device`` (each followed by fsync, so every
  file is on the disk when timed): ``pyinit.checkpoint.save``,
  ``save(background=True)`` (start to ``wait()``, and how long the caller was
  blocked), safetensors' ``save_file``, ``torch.save``, and fio's sequential
  direct write of the same size; on a GPU also the bare device-to-host copy
  of the state into pinned memory, the floor a background save blocks for;
- loads onto ``--device`` (the page cache dropped before each, as root):
  ``pyinit.checkpoint.load``, safetensors' ``load_file``, fastsafetensors
  (its pread bounce path, where it is installed), ``torch.load``, and fio's
  sequential direct read of the same file;
- with ``--dcp``: ``torch.distributed.checkpoint`` save and load through
  ``DirectStorageWriter``/``DirectStorageReader`` beside its own
  ``FileSystemWriter``/``FileSystemReader``, on ``--ranks`` processes (gloo;
  each rank holds ``--size`` / ranks, on its own GPU with a CUDA device).

The state is shaped like a transformer's: 4096 x 4096 bf16 weights and two
4096-element fp32 norms per weight. For every pyinit save and load the peak
of the process's resident memory over what it held before is kept
(``/proc/self/clear_refs`` resets the peak), beside the staging blocks' size.
Reported per operation and tool: median seconds, GB/s, and each target's
ratio with whether it is met.

    pyinit bench checkpoint                                    # 2 GiB, /var/tmp, CUDA if there
    pyinit bench checkpoint --dir /ckpt --size 16G --rounds 1 --device cuda:0
    pyinit bench checkpoint --dcp --ranks 2 --device cpu --dir /mnt/loop
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from pyinit import argtypes
from pyinit.bench.io import best_sequential_read, check_room, drop_caches, exited, fio_job
from pyinit.bench.targets import print_targets, ratio_target
from pyinit.errors import InputError
from pyinit.extras import note_missing, require
from pyinit.jsonfile import write_json
from pyinit.plotting import human_bytes, pyplot, save_figure
from pyinit.termination import held_back, stopped_on_error

if TYPE_CHECKING:
    import torch

WEIGHT = (4096, 4096)  # bf16: 32 MiB each
# The files on the disk at once: the two the loads read (pyinit's safetensors
# file and torch's .pt) and the save being timed.
FILES_AT_ONCE = 3
SAVES = ("pyinit", "pyinit background", "safetensors", "torch.save", "fio write", "d2h copy")
LOADS = ("pyinit", "safetensors", "fastsafetensors", "torch.load", "fio read")
DCP = ("pyinit save", "torch save", "pyinit load", "torch load")


def layer_count(size: int) -> int:
    """The layers of state_dict(size): as many weights as fit in it, at least one."""
    return max(1, size // (WEIGHT[0] * WEIGHT[1] * 2))


LAYER_BYTES = WEIGHT[0] * WEIGHT[1] * 2 + 2 * WEIGHT[0] * 4  # a bf16 weight, two fp32 norms


def state_dict(size: int, device: str, seed: int = 0) -> dict[str, torch.Tensor]:
    import torch

    weights = layer_count(size)
    generator = torch.Generator(device).manual_seed(seed)  # made where it lives: 16 GiB is quick
    tensors = {}
    for i in range(weights):
        weight = torch.randn(WEIGHT, generator=generator, device=device)
        tensors[f"layers.{i}.weight"] = weight.to(torch.bfloat16)
        tensors[f"layers.{i}.norm1"] = torch.ones(WEIGHT[0], device=device)
        tensors[f"layers.{i}.norm2"] = torch.ones(WEIGHT[0], device=device)
    return tensors


def nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def arrived(tensors: dict[str, torch.Tensor], device: str) -> None:
    """Every byte is where the load put it: on a GPU once the copies are
    done; on the CPU once each page was touched (safetensors maps the file
    and would otherwise read nothing)."""
    import torch

    synchronize(device)
    if not device.startswith("cuda"):
        for tensor in tensors.values():
            flat = tensor.reshape(-1).view(torch.uint8)
            if flat.numel():
                flat[::4096].sum()


class HostPeak:
    """The resident set's peak over its size at the start, for one operation."""

    def __enter__(self) -> HostPeak:
        with contextlib.suppress(OSError):
            Path("/proc/self/clear_refs").write_text("5\n")  # the peak starts again from now
        self.before = self._status("VmRSS")
        self.bytes = 0
        return self

    def __exit__(self, *exc: object) -> None:
        self.bytes = max(0, self._status("VmHWM") - self.before)

    @staticmethod
    def _status(field: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        return 0


def room_needed(args: argparse.Namespace) -> int:
    """The most bytes the benchmark keeps in `--dir` at once: the file loads'
    three files, then (they are gone by then) DCP's one checkpoint, each of
    the state state_dict makes; with 1% and 16 MiB more for headers, metadata
    and the filesystem's own blocks."""
    files = 0 if args.no_files else FILES_AT_ONCE * layer_count(args.size) * LAYER_BYTES
    dcp = args.ranks * layer_count(args.size // args.ranks) * LAYER_BYTES if args.dcp else 0
    return max(files, dcp) * 101 // 100 + (16 << 20)


@contextlib.contextmanager
def another_tool(tool: str, path: Path) -> Iterator[None]:
    """Another project's tool failing (torch.save's RuntimeError on a full
    disk, safetensors' own error, fio's exit status) as an OSError naming the
    tool and the file, so the command says it in one line: the system failed
    under it, the benchmark did not. pyinit's own tools are not wrapped: what
    they raise beyond OSError is a bug and keeps its traceback."""
    try:
        yield
    except OSError:
        raise
    except subprocess.CalledProcessError as e:
        raise exited(tool, e.returncode, e.stderr or "", path) from e
    except Exception as e:
        said = str(e).strip().splitlines()
        raise OSError(None, f"{tool} failed: {said[0] if said else type(e).__name__}",
                      str(path)) from e  # fmt: skip


def run_fio(path: Path, size: int, rw: str) -> float:
    """Seconds for fio to write (`rw` "write", then fsync) or read ("read")
    `size` bytes of `path` sequentially with O_DIRECT, 1 MiB at depth 32 (as
    pyinit's reader and writer queue theirs)."""
    command = [
        "fio", "--name=ckpt", f"--filename={path}", "--ioengine=io_uring", "--direct=1",
        f"--rw={rw}", "--bs=1m", "--iodepth=32", f"--size={size}", "--output-format=json",
    ] + (["--end_fsync=1"] if rw == "write" else [])  # fmt: skip
    return size / fio_job(command, rw)["bw_bytes"]


def bench_ceiling(args: argparse.Namespace, size: int) -> list[dict]:
    """The pipeline's own limit, the disk out of it: a save to memory (tmpfs)
    and loads of it onto the device (CRCs checked, GPU copies made), and one
    core's CRC-32C over 256 MiB, from memory and a block at a time in cache.
    Empty, with a line, where /dev/shm cannot hold the state."""
    import torch

    from pyinit import checkpoint
    from pyinit.io import crc32c

    shm = Path("/dev/shm")
    free = shutil.disk_usage(shm).free if shm.is_dir() else 0
    size = min(size, free // 3)
    if size < 64 << 20:
        print("pyinit bench checkpoint: /dev/shm cannot hold the state: the in-memory ceiling "
              "is left out", file=sys.stderr)  # fmt: skip
        return []
    tensors = state_dict(size, args.device)
    size = nbytes(tensors)
    path = Path(tempfile.mkdtemp(dir=shm, prefix="pyinit-bench-")) / "ceiling.safetensors"
    results = []
    data = torch.randint(0, 256, (256 << 20,), dtype=torch.uint8).numpy()

    def crc32c_blocks(data) -> None:
        # As a load takes them: a reader's 1 MiB block checked while its copy
        # is still in that core's cache, here the same block again and again.
        block = data[: 1 << 20]
        for _ in range(data.nbytes // block.nbytes):
            crc32c(block)

    def timed(tool: str, nbytes: int, work: Callable[[], object], round_no: int) -> None:
        started = time.perf_counter()
        work()
        synchronize(args.device)
        seconds = time.perf_counter() - started
        results.append({"op": "ceiling", "tool": tool, "round": round_no, "seconds": seconds,
                        "gb_s": nbytes / seconds / 1e9})  # fmt: skip

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tmpfs refuses O_DIRECT: reads and writes buffered
            for round_no in range(args.rounds):
                timed("save to memory", size, lambda: checkpoint.save(tensors, path), round_no)
                timed("load from memory", size,
                      lambda: checkpoint.load(path, device=args.device), round_no)  # fmt: skip
                timed("crc32c, one core, from memory", data.nbytes, lambda: crc32c(data),
                      round_no)  # fmt: skip
                timed("crc32c, one core, in cache", data.nbytes, lambda: crc32c_blocks(data),
                      round_no)  # fmt: skip
    finally:
        shutil.rmtree(path.parent, ignore_errors=True)
    return results


def save_with(tool: str, device: str) -> Callable[[dict[str, torch.Tensor], Path], dict]:
    """The tool's save of tensors to path, fsync included; returns extra
    figures of the run (blocked seconds, host peak)."""
    import torch

    from pyinit import checkpoint

    def pyinit_save(tensors: dict[str, torch.Tensor], path: Path) -> dict:
        with HostPeak() as peak:
            checkpoint.save(tensors, path)
        return {"peak_host_bytes": peak.bytes}

    def background(tensors: dict[str, torch.Tensor], path: Path) -> dict:
        started = time.perf_counter()
        pending = checkpoint.save(tensors, path, background=True)
        blocked = time.perf_counter() - started
        pending.wait()
        return {"blocked_s": blocked}

    def safetensors_save(tensors: dict[str, torch.Tensor], path: Path) -> dict:
        from safetensors.torch import save_file

        save_file(tensors, path)
        fsync_path(path)
        return {}

    def torch_save(tensors: dict[str, torch.Tensor], path: Path) -> dict:
        torch.save(tensors, path)
        fsync_path(path)
        return {}

    def d2h_copy(tensors: dict[str, torch.Tensor], path: Path) -> dict:
        # What a snapshot must do at least: every tensor into pinned host memory.
        copies = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors.values()]
        synchronize(device)
        started = time.perf_counter()
        for copy, tensor in zip(copies, tensors.values(), strict=True):
            copy.copy_(tensor, non_blocking=True)
        synchronize(device)
        return {"seconds": time.perf_counter() - started}

    return {"pyinit": pyinit_save, "pyinit background": background,
            "safetensors": safetensors_save, "torch.save": torch_save,
            "d2h copy": d2h_copy}[tool]  # fmt: skip


def load_with(tool: str, device: str) -> Callable[[Path], dict]:
    """The tool's load of path onto the device (every tensor there when it returns)."""
    import torch

    from pyinit import checkpoint

    def pyinit_load(path: Path) -> dict:
        with HostPeak() as peak:
            tensors = checkpoint.load(path, device=device)
            arrived(tensors, device)
        del tensors
        return {"peak_host_bytes": peak.bytes}

    def safetensors_load(path: Path) -> dict:
        from safetensors.torch import load_file

        tensors = load_file(path, device=device)
        arrived(tensors, device)
        del tensors
        return {}

    def fastsafetensors_load(path: Path) -> dict:
        from fastsafetensors import SafeTensorsFileLoader, SingleGroup

        loader = SafeTensorsFileLoader(SingleGroup(), device, nogds=True)
        try:
            loader.add_filenames({0: [str(path)]})
            buffers = loader.copy_files_to_device()
            tensors = {key: buffers.get_tensor(key) for key in loader.get_keys()}
            arrived(tensors, device)
            del tensors
            buffers.close()
        finally:
            loader.close()
        return {}

    def torch_load(path: Path) -> dict:
        tensors = torch.load(path.with_suffix(".pt"), map_location=device, weights_only=True)
        arrived(tensors, device)
        del tensors
        return {}

    return {"pyinit": pyinit_load, "safetensors": safetensors_load,
            "fastsafetensors": fastsafetensors_load, "torch.load": torch_load}[tool]  # fmt: skip


def available(tools: tuple[str, ...], device: str, no_fio: bool) -> list[str]:
    """The tools this machine has, each missing one said once."""
    import importlib.util

    kept = []
    for tool in tools:
        module = {"safetensors": "safetensors", "fastsafetensors": "fastsafetensors"}.get(tool)
        if module and importlib.util.find_spec(module) is None:
            print(f"pyinit bench checkpoint: no {module} here (pip install {module}): "
                  f"left out", file=sys.stderr)  # fmt: skip
            continue
        if tool.startswith("fio") and (no_fio or not shutil.which("fio")):
            if not no_fio:
                print("pyinit bench checkpoint: no fio here: the disk's ceiling is left out",
                      file=sys.stderr)  # fmt: skip
            continue
        if tool == "d2h copy" and not device.startswith("cuda"):
            continue
        if tool == "fastsafetensors" and not device.startswith("cuda"):
            continue  # it loads onto a GPU
        kept.append(tool)
    return kept


def rotate(tools: list[str], round_no: int) -> list[str]:
    shift = round_no % len(tools) if tools else 0
    return tools[shift:] + tools[:shift]


def bench_files(args: argparse.Namespace, folder: Path, size: int) -> tuple[list[dict], int, int]:
    """Saves and loads of one file, round by round; the results, the bytes and
    tensor count. Every file it wrote is gone when it returns or raises."""
    tensors = state_dict(size, args.device)
    size = nbytes(tensors)
    target = folder / "pyinit-bench-load.safetensors"
    written = {target, target.with_suffix(".pt")}
    try:
        return _rounds(args, folder, tensors, target, written), size, len(tensors)
    finally:
        for path in written:
            path.unlink(missing_ok=True)


def _by(tool: str, path: Path) -> contextlib.AbstractContextManager[None]:
    """another_tool for the tools of other projects; nothing for pyinit's."""
    return contextlib.nullcontext() if tool.startswith("pyinit") else another_tool(tool, path)


def _rounds(args: argparse.Namespace, folder: Path, tensors: dict[str, torch.Tensor],
            target: Path, written: set[Path]) -> list[dict]:  # fmt: skip
    import torch

    size = nbytes(tensors)
    saves = available(SAVES, args.device, args.no_fio)
    loads = available(LOADS, args.device, args.no_fio)
    results = []
    for round_no in range(args.rounds):
        for tool in rotate(saves, round_no):
            path = folder / f"pyinit-bench-ckpt.{tool.replace(' ', '-')}"
            written.add(path)
            path.unlink(missing_ok=True)
            os.sync()  # what the previous tool left dirty is not charged to this one
            started = time.perf_counter()
            with _by(tool, path):
                extra = (
                    {"seconds": run_fio(path, size, "write")}
                    if tool == "fio write"
                    else save_with(tool, args.device)(tensors, path)
                )
            seconds = extra.pop("seconds", time.perf_counter() - started)
            path.unlink(missing_ok=True)
            results.append({"op": "save", "tool": tool, "round": round_no, "seconds": seconds,
                            "gb_s": size / seconds / 1e9, **extra})  # fmt: skip
            print(f"round {round_no} save {tool}: {seconds:.2f} s", file=sys.stderr)
        if round_no == 0:  # what the loads read: pyinit's file (safetensors), torch's
            from pyinit import checkpoint

            checkpoint.save(tensors, target)
            if "torch.load" in loads:
                with another_tool("torch.save", target.with_suffix(".pt")):
                    torch.save(tensors, target.with_suffix(".pt"))
                fsync_path(target.with_suffix(".pt"))
            if "fio read" in loads:  # the disk's ceiling is fio's best setting, not one
                with another_tool("fio", target):
                    setting, rate, rates = best_sequential_read(str(target), target.stat().st_size)
                results.append({"op": "load", "tool": "fio best read", "round": 0,
                                "seconds": size / rate, "gb_s": rate / 1e9, "setting": setting,
                                "sweep_gb_s": {k: v / 1e9 for k, v in rates.items()}})  # fmt: skip
                print(f"fio's best sequential read: {setting}, {rate / 1e9:.2f} GB/s",
                      file=sys.stderr)  # fmt: skip
        for tool in rotate(loads, round_no):
            dropped = drop_caches()
            started = time.perf_counter()
            with _by(tool, target):
                if tool == "fio read":
                    extra = {"seconds": run_fio(target, target.stat().st_size, "read")}
                else:
                    extra = load_with(tool, args.device)(target)
            seconds = extra.pop("seconds", time.perf_counter() - started)
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
            results.append({"op": "load", "tool": tool, "round": round_no, "seconds": seconds,
                            "gb_s": size / seconds / 1e9, "cold": dropped, **extra})  # fmt: skip
            print(f"round {round_no} load {tool}: {seconds:.2f} s", file=sys.stderr)
    return results


# ---------------------------------------------------------------------------
# DCP: the ranks run this module.


def dcp_rank(folder: Path, size: int, rounds: int, device: str) -> None:
    """One rank's share: its own part of the state, saved and loaded by both
    storages in turn; rank 0 prints the results as one JSON line."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

    from pyinit.checkpoint import DirectStorageReader, DirectStorageWriter

    warnings.simplefilter("ignore")  # DCP's notes on single-process saves
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    try:
        rank = dist.get_rank() if distributed else 0
        world = dist.get_world_size() if distributed else 1
        if device.startswith("cuda"):
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        shard = state_dict(size // world, device, seed=rank)
        state = {f"rank{rank}.{name}": tensor for name, tensor in shard.items()}
        storages = {"pyinit": (DirectStorageWriter, DirectStorageReader),
                    "torch": (FileSystemWriter, FileSystemReader)}  # fmt: skip
        results = []

        def together() -> None:
            if distributed:
                dist.barrier()

        for round_no in range(rounds):
            for kind in rotate(["pyinit", "torch"], round_no):
                writer, reader = storages[kind]
                path = folder / f"pyinit-bench-dcp-{kind}"
                if rank == 0:
                    shutil.rmtree(path, ignore_errors=True)
                    os.sync()
                together()
                started = time.perf_counter()
                dcp.save(state, storage_writer=writer(path))
                synchronize(device)
                together()
                saved = time.perf_counter() - started
                if rank == 0:
                    drop_caches()
                together()
                into = {name: torch.empty_like(t) for name, t in state.items()}
                started = time.perf_counter()
                dcp.load(into, storage_reader=reader(path))
                synchronize(device)
                together()
                loaded = time.perf_counter() - started
                del into
                results += [{"op": "dcp", "tool": f"{kind} save", "round": round_no,
                             "seconds": saved},
                            {"op": "dcp", "tool": f"{kind} load", "round": round_no,
                             "seconds": loaded}]  # fmt: skip
                if rank == 0:
                    shutil.rmtree(path, ignore_errors=True)
        if rank == 0:
            print(json.dumps({"results": results, "bytes": nbytes(shard) * world}), flush=True)
    finally:
        # Also after a failed save: gloo's teardown of a group left standing can
        # abort the process ("terminate called without an active exception"),
        # and SIGABRT's status would hide the error the rank printed.
        if distributed:
            dist.destroy_process_group()


def bench_dcp(args: argparse.Namespace, folder: Path, size: int) -> tuple[list[dict], int]:
    """Starts the ranks (this module, each its own process) and gathers rank 0's results."""
    import socket

    from pyinit.checkpoint.dcp import staging_folder

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "pyinit.bench.checkpoint", "--dcp-rank", str(folder),
               str(size), str(args.rounds), args.device]  # fmt: skip
    started: list[subprocess.Popen] = []
    said: list[IO[str]] = []
    # Each rank's stderr in a file, not a pipe: a rank blocked writing to a full
    # pipe while another waits for it at a barrier would hang both.
    with contextlib.ExitStack() as files:
        try:
            with stopped_on_error(started):
                for rank in range(args.ranks):
                    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                               RANK=str(rank), LOCAL_RANK=str(rank),
                               WORLD_SIZE=str(args.ranks))  # fmt: skip
                    if args.ranks == 1:
                        env.pop("WORLD_SIZE")
                    said.append(files.enter_context(tempfile.TemporaryFile("w+")))
                    # From the folder: a checkout in the working directory cannot shadow
                    # the package.
                    with held_back():
                        started.append(subprocess.Popen(command, env=env, cwd=folder,
                                                        stdout=subprocess.PIPE, stderr=said[-1],
                                                        text=True))  # fmt: skip
                outputs = [proc.communicate()[0] for proc in started]
        finally:  # a rank that failed left its checkpoint behind, or its staging folder
            for kind in ("pyinit", "torch"):
                path = folder / f"pyinit-bench-dcp-{kind}"
                for left in (path, Path(staging_folder(str(path)))):
                    shutil.rmtree(left, ignore_errors=True)
        for proc, errors in zip(started, said, strict=True):
            if proc.returncode:  # its traceback's last line says what failed (a full disk, ...)
                errors.seek(0)
                raise exited("a DCP rank", proc.returncode, errors.read(), folder)
    document = json.loads(outputs[0].strip().splitlines()[-1])
    for row in document["results"]:
        row["gb_s"] = document["bytes"] / row["seconds"] / 1e9
    return document["results"], document["bytes"]


# ---------------------------------------------------------------------------
# The table, the targets, the plot.


def table_of(results: list[dict]) -> dict[str, dict[str, dict[str, float]]]:
    table: dict[str, dict[str, dict[str, float]]] = {}
    for row in results:
        table.setdefault(row["op"], {}).setdefault(row["tool"], {})
    for op, tools in table.items():
        for tool, cell in tools.items():
            rows = [r for r in results if r["op"] == op and r["tool"] == tool]
            cell["seconds"] = statistics.median(r["seconds"] for r in rows)
            cell["gb_s"] = statistics.median(r["gb_s"] for r in rows)
            # The background save's block: the first save of a process pins the
            # memory its snapshots go to and later ones reuse it, so the first is
            # kept apart and the median is the later ones'. The host peak: the
            # largest, the first run's, when the process first touches the memory.
            blocks = [r["blocked_s"] for r in rows if "blocked_s" in r]
            if blocks:
                cell["first_blocked_s"] = blocks[0]
                cell["blocked_s"] = statistics.median(blocks[1:] or blocks)
            if any("setting" in r for r in rows):
                cell["setting"] = rows[0]["setting"]
            if any("peak_host_bytes" in r for r in rows):
                cell["peak_host_bytes"] = max(r["peak_host_bytes"] for r in rows)
    return table


def targets(table: dict, staging: int, device: str,
            page_cache_backed: bool = False) -> list[dict[str, Any]]:  # fmt: skip
    """The issue's targets that this run's table can answer."""
    found = []

    def add(name: str, ours: float | None, anchor: float | None, need: float,
            higher: bool = True, device_best: float | None = None) -> None:  # fmt: skip
        if ours is None or anchor is None or anchor <= 0:
            return
        found.append(ratio_target(name, ours, anchor, need, higher, device_best))

    def rate(op: str, tool: str) -> float | None:
        cell = table.get(op, {}).get(tool)
        return cell["gb_s"] if cell else None

    # A load's floor over another reader is bounded by the disk's best read.
    disk = rate("load", "fio best read")
    loads = [rate("load", t) for t in ("safetensors", "fastsafetensors")]
    best = max((x for x in loads if x), default=None)
    if device.startswith("cuda"):
        add("load / best of safetensors and fastsafetensors", rate("load", "pyinit"), best, 1.3,
            device_best=disk)  # fmt: skip
    else:  # cold, tensors touched; a loop image read through the page cache: 1.0
        add("load / safetensors load_file", rate("load", "pyinit"), rate("load", "safetensors"),
            1.0 if page_cache_backed else 1.5, device_best=disk)  # fmt: skip
    setting = table.get("load", {}).get("fio best read", {}).get("setting", "")
    add(f"load / fio's best sequential read ({setting})", rate("load", "pyinit"),
        rate("load", "fio best read"), 0.95)  # fmt: skip
    add("in-memory load (pipeline ceiling), GB/s / 10", rate("ceiling", "load from memory"), 10.0,
        1.0)  # fmt: skip
    # In cache, as the pipeline takes them; from memory a core's CRC is a core's
    # read of memory (both 12-13 GB/s on an H200 node), whatever the method.
    add("CRC-32C on one core, 1 MiB blocks in cache, GB/s / 15",
        rate("ceiling", "crc32c, one core, in cache"), 15.0, 1.0)  # fmt: skip
    add("save / safetensors save_file + fsync", rate("save", "pyinit"), rate("save", "safetensors"),
        1.5)  # fmt: skip
    add("save / fio sequential direct write", rate("save", "pyinit"), rate("save", "fio write"),
        0.9)  # fmt: skip
    background = table.get("save", {}).get("pyinit background", {}).get("blocked_s")
    copy = table.get("save", {}).get("d2h copy", {}).get("seconds")
    add("background save's block / device-to-host copy", background, copy, 1.0, higher=False)
    add("DCP save / FileSystemWriter", rate("dcp", "pyinit save"), rate("dcp", "torch save"), 1.5)
    add("DCP load / FileSystemReader", rate("dcp", "pyinit load"), rate("dcp", "torch load"), 1.5,
        device_best=disk)  # fmt: skip
    for op in ("save", "load"):
        peak = table.get(op, {}).get("pyinit", {}).get("peak_host_bytes")
        # A CPU load's tensors are host memory themselves: only a device's is bounded.
        if peak is not None and staging and device.startswith("cuda"):
            add(f"host memory peak of a device {op} / staging", peak, staging, 1.0, higher=False)
    return found


def plot(document: dict, path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    ops = list(document["table"])
    fig, axes = plt.subplots(1, len(ops), figsize=(5 * len(ops), 4), squeeze=False)
    for ax, op in zip(axes[0], ops, strict=True):
        tools = list(document["table"][op])
        ax.bar(tools, [document["table"][op][t]["gb_s"] for t in tools], color="#8fb8de")
        for i, tool in enumerate(tools):
            rounds = [r["gb_s"] for r in document["results"] if r["op"] == op and r["tool"] == tool]
            ax.plot([i] * len(rounds), rounds, "k.")
        ax.set_title(op)
        ax.set_ylabel("GB/s")
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle(f"{human_bytes(document['bytes'])} checkpoint, {document['device']}, "
                 f"{document['folder']}; {document['machine']}, {document['date']}")  # fmt: skip
    return save_figure(fig, path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", default="/var/tmp", help="the folder the files go to")
    parser.add_argument("--size", type=argtypes.size(1 << 20), default=2 << 30, metavar="SIZE")
    parser.add_argument("--rounds", type=argtypes.whole(1, 100), default=3)
    parser.add_argument("--device", default=None,
                        help="where the state lives (default cuda:0, else cpu)")  # fmt: skip
    parser.add_argument("--dcp", action="store_true",
                        help="torch.distributed.checkpoint's save and load too")  # fmt: skip
    parser.add_argument("--ranks", type=argtypes.whole(1, 64), default=1,
                        help="processes the DCP state is split over (gloo)")  # fmt: skip
    parser.add_argument("--no-files", action="store_true",
                        help="leave out the single-file saves and loads (with --dcp)")  # fmt: skip
    parser.add_argument("--no-fio", action="store_true", help="leave out fio's direct IO")
    parser.add_argument("--no-ceiling", action="store_true",
                        help="leave out the pipeline's in-memory ceiling")  # fmt: skip
    parser.add_argument("--out", default=".", metavar="DIR",
                        help="folder for checkpoint.json and checkpoint.png")  # fmt: skip
    parser.add_argument("--machine", default=os.uname().nodename, help="named in the plot")


def main(args: argparse.Namespace) -> int:
    require("torch", "pyinit bench checkpoint")
    folder = Path(args.dir)
    if not folder.is_dir():
        raise InputError(f"--dir {folder}: no such folder")
    if args.no_files and not args.dcp:
        raise InputError("--no-files leaves nothing to time without --dcp")
    import torch

    from pyinit.checkpoint import staging

    if args.device is None:
        args.device = "cuda:0" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(args.device)
    except RuntimeError:
        device = None
    problem = staging.device_problem(device)
    if problem and device is not None and device.type == "cuda":
        # A GPU this machine lacks: its hardware, not the command line.
        print(f"pyinit bench checkpoint: --device {args.device}: {problem}", file=sys.stderr)
        return 1
    if problem:
        raise InputError(f"--device {args.device}: {problem}")
    note_missing("matplotlib", "the PNG", "pyinit bench checkpoint")  # once the arguments are good
    check_room(folder, room_needed(args))

    results, size, count = [], args.size, 0
    if not args.no_files:
        results, size, count = bench_files(args, folder, args.size)
    if not args.no_files and not args.no_ceiling:
        results += bench_ceiling(args, size)
    if args.dcp:
        rows, size = bench_dcp(args, folder, args.size)
        results += rows
    table = table_of(results)
    from pyinit.checkpoint.in_place import page_cache_backed

    met = targets(table, staging.staging_bytes(), args.device,
                  page_cache_backed(str(folder)))  # fmt: skip
    print(f"{human_bytes(size)} on {args.device} to {folder}, median of {args.rounds}")
    print(f"{'':7} {'tool':18} {'seconds':>8} {'GB/s':>7} {'blocked s':>10} {'host peak':>10}")
    for op, tools in table.items():
        for tool, cell in tools.items():
            blocked = f"{cell['blocked_s']:.3f}" if "blocked_s" in cell else ""
            peak = human_bytes(cell["peak_host_bytes"]) if "peak_host_bytes" in cell else ""
            setting = f"  {cell['setting']}" if "setting" in cell else ""
            print(f"{op:7} {tool:18} {cell['seconds']:8.2f} {cell['gb_s']:7.2f} {blocked:>10} "
                  f"{peak:>10}{setting}")  # fmt: skip
    first = table.get("save", {}).get("pyinit background", {}).get("first_blocked_s")
    if first is not None:
        print(f"background save: the first blocked {first:.3f} s (it pins its snapshot memory)")
    print(f"staging: {human_bytes(staging.staging_bytes())}")
    print_targets(met)
    document = {"machine": args.machine, "date": time.strftime("%Y-%m-%d"),
                "folder": str(folder), "device": args.device, "bytes": size, "tensors": count,
                "rounds": args.rounds, "ranks": args.ranks,
                "staging_bytes": staging.staging_bytes(), "results": results, "table": table,
                "targets": met}  # fmt: skip
    out = write_json(Path(args.out) / "checkpoint.json", document, indent=2)
    png = out.with_suffix(".png")
    print(f"wrote {out}" + (f" and {png}" if plot(document, png) else ""))
    return 0


if __name__ == "__main__":
    # A DCP rank, started by bench_dcp: --dcp-rank FOLDER SIZE ROUNDS DEVICE
    _, _, rank_folder, rank_size, rank_rounds, rank_device = sys.argv
    dcp_rank(Path(rank_folder), int(rank_size), int(rank_rounds), rank_device)
