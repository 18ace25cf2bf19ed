"""Checkpoint writes: pyinit.checkpoint.save beside torch.save and
safetensors' save_file (each followed by os.fsync, so all three are on the
disk when timed), and fio's sequential direct write of the same size to the
same folder, as the disk's ceiling.

The state dict is shaped like a transformer's: 4096 x 4096 bf16 weights and
two 4096-element fp32 norms per weight, about --size bytes in all. Round by
round the four run in a rotating order, each to a new file (the previous one
removed and the page cache written back first). Reported per tool: median
seconds, GB/s, and how many times faster pyinit is.

    pyinit bench checkpoint                       # 2 GiB in /var/tmp
    pyinit bench checkpoint --dir /ckpt --size 8G --rounds 5 --out ckpt.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pyinit import argtypes
from pyinit.errors import InputError
from pyinit.extras import note_missing, require
from pyinit.jsonfile import write_json
from pyinit.plotting import human_bytes, pyplot, save_figure

if TYPE_CHECKING:
    import torch

WEIGHT = (4096, 4096)  # bf16: 32 MiB each
TOOLS = ("pyinit", "torch.save", "safetensors", "fio")


def state_dict(size: int) -> dict[str, torch.Tensor]:
    import torch

    weights = max(1, size // (WEIGHT[0] * WEIGHT[1] * 2))
    generator = torch.Generator().manual_seed(0)
    tensors = {}
    for i in range(weights):
        tensors[f"layers.{i}.weight"] = torch.randn(WEIGHT, generator=generator).to(torch.bfloat16)
        tensors[f"layers.{i}.norm1"] = torch.ones(WEIGHT[0])
        tensors[f"layers.{i}.norm2"] = torch.ones(WEIGHT[0])
    return tensors


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_with(tool: str) -> Callable[[dict[str, torch.Tensor], Path], None]:
    import torch

    from pyinit import checkpoint

    if tool == "pyinit":
        return lambda tensors, path: checkpoint.save(tensors, path)
    if tool == "torch.save":

        def torch_save(tensors: dict[str, torch.Tensor], path: Path) -> None:
            torch.save(tensors, path)
            fsync_path(path)

        return torch_save
    from safetensors.torch import save_file

    def safetensors_save(tensors: dict[str, torch.Tensor], path: Path) -> None:
        save_file(tensors, path)
        fsync_path(path)

    return safetensors_save


def run_fio(folder: Path, size: int) -> float:
    """Seconds for fio to write `size` bytes sequentially with O_DIRECT and fsync."""
    target = folder / "pyinit-bench-fio.dat"
    command = [
        "fio", "--name=ckpt", f"--filename={target}", "--ioengine=io_uring", "--direct=1",
        "--rw=write", "--bs=1m", "--iodepth=16", f"--size={size}", "--end_fsync=1",
        "--output-format=json",
    ]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=True)
    finally:
        target.unlink(missing_ok=True)
    write = json.loads(done.stdout[done.stdout.index("{") :])["jobs"][0]["write"]
    return size / write["bw_bytes"]


def plot(document: dict, path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    table = document["table"]
    names = list(table)
    ax.bar(names, [table[n]["gb_s"] for n in names], color="#8fb8de")
    for i, name in enumerate(names):
        rounds = [r["gb_s"] for r in document["results"] if r["tool"] == name]
        ax.plot([i] * len(rounds), rounds, "k.", label="rounds" if i == 0 else None)
    ax.set_ylabel("GB/s, write and fsync")
    ax.set_title(
        f"{human_bytes(document['bytes'])} checkpoint to {document['folder']}\n"
        f"{document['machine']}, {document['date']}"
    )
    ax.legend()
    return save_figure(fig, path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", default="/var/tmp", help="the folder the files go to")
    parser.add_argument("--size", type=argtypes.size(1 << 20), default=2 << 30, metavar="SIZE")
    parser.add_argument("--rounds", type=argtypes.whole(1, 100), default=3)
    parser.add_argument("--no-fio", action="store_true", help="leave out fio's direct write")
    parser.add_argument("--out", default=".", metavar="DIR",
                        help="folder for checkpoint.json and checkpoint.png")  # fmt: skip
    parser.add_argument("--machine", default=os.uname().nodename, help="named in the plot")


def main(args: argparse.Namespace) -> int:
    require("torch", "pyinit bench checkpoint")
    folder = Path(args.dir)
    if not folder.is_dir():
        raise InputError(f"--dir {folder}: no such folder")
    note_missing("matplotlib", "the PNG", "pyinit bench checkpoint")  # once the arguments are good
    tools = [t for t in TOOLS if t != "fio" or (not args.no_fio and shutil.which("fio"))]
    try:
        import safetensors  # noqa: F401
    except ImportError:
        print("pyinit bench checkpoint: no safetensors (pip install safetensors)", file=sys.stderr)
        tools.remove("safetensors")
    tensors = state_dict(args.size)
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    results = []
    for round_no in range(args.rounds):
        order = tools[round_no % len(tools) :] + tools[: round_no % len(tools)]
        for tool in order:
            target = folder / f"pyinit-bench-ckpt.{tool}"
            target.unlink(missing_ok=True)
            os.sync()  # what the previous tool left dirty is not charged to this one
            if tool == "fio":
                seconds = run_fio(folder, size)
            else:
                started = time.perf_counter()
                save_with(tool)(tensors, target)
                seconds = time.perf_counter() - started
                target.unlink()
            results.append({"tool": tool, "round": round_no, "seconds": seconds,
                            "gb_s": size / seconds / 1e9})  # fmt: skip
            print(f"round {round_no} {tool}: {seconds:.2f} s", file=sys.stderr)
    table = {}
    for tool in tools:
        seconds = statistics.median(r["seconds"] for r in results if r["tool"] == tool)
        table[tool] = {"seconds": seconds, "gb_s": size / seconds / 1e9}
    ours = table["pyinit"]["seconds"]
    print(f"{human_bytes(size)} in {len(tensors)} tensors to {folder}, median of {args.rounds}")
    print(f"{'tool':12} {'seconds':>8} {'GB/s':>7} {'pyinit is':>10}")
    for tool, row in table.items():
        row["pyinit_speedup"] = row["seconds"] / ours
        print(f"{tool:12} {row['seconds']:8.2f} {row['gb_s']:7.2f} {row['pyinit_speedup']:9.2f}x")
    document = {"machine": args.machine, "date": time.strftime("%Y-%m-%d"),
                "folder": str(folder), "bytes": size, "tensors": len(tensors),
                "rounds": args.rounds, "results": results, "table": table}  # fmt: skip
    out = write_json(Path(args.out) / "checkpoint.json", document, indent=2)
    png = out.with_suffix(".png")
    print(f"wrote {out}" + (f" and {png}" if plot(document, png) else ""))
    return 0
