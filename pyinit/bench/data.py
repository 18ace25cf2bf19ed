"""Data loader benchmark: TokenShardDataset against the nanoGPT-style baseline
(np.memmap of the same shards, one slice per window, torch.stack), on the
same windows, cold (page cache dropped before each run) and warm (every shard
read into the page cache first), rounds interleaved. Also: sharder throughput
and what the compiled loops buy over the same source run as plain Python.

    pyinit bench data --gib 8 --out DIR
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from pyinit import argtypes
from pyinit.bench.io import drop_caches
from pyinit.data import kernels, sharder
from pyinit.data.shard_format import HEADER_BYTES, ShardWriter, read_header
from pyinit.errors import InputError
from pyinit.extras import installed, note_missing, require
from pyinit.jsonfile import write_json
from pyinit.plotting import pyplot, save_figure

if TYPE_CHECKING:
    import torch

    from pyinit.data import TokenShardDataset

VOCAB = 50257  # GPT-2's: uint16 tokens, as nanoGPT stores them


RUN_ID = 0x0BE7C4  # one fixed run: shards kept from an earlier benchmark form a set with new ones


def _has_tokens(path: Path, tokens: int) -> bool:
    """A shard of this benchmark's run already there with `tokens` tokens."""
    try:
        header = read_header(path)
    except (OSError, InputError):
        return False  # absent, or from another pod-init's format: made anew
    return header.token_count == tokens and header.run_id == RUN_ID


def make_shards(folder: Path, total_bytes: int, count: int) -> list[str]:
    """Random tokens in `count` shards (reused when already there at that size)."""
    folder.mkdir(parents=True, exist_ok=True)
    tokens_per_shard = total_bytes // 2 // count
    paths = [folder / sharder.shard_name(i, count) for i in range(count)]
    if all(_has_tokens(p, tokens_per_shard) for p in paths):
        return [str(p) for p in paths]
    rng = np.random.default_rng(0)
    for i, path in enumerate(paths):
        writer = ShardWriter(path, 2, VOCAB, VOCAB - 1, i, count, run_id=RUN_ID)
        left = tokens_per_shard
        while left:
            step = min(left, 64 << 20)
            writer.append(rng.integers(0, VOCAB, step, dtype=np.uint16), np.array([step]))
            left -= step
        writer.finish()
        writer.publish()
    return [str(p) for p in paths]


class MemmapBaseline:
    """nanoGPT's get_batch over the same shards and windows."""

    def __init__(self, dataset: TokenShardDataset):
        self.dataset = dataset
        self.maps = [
            np.memmap(h.path, dtype=h.dtype, mode="r", offset=HEADER_BYTES, shape=(h.token_count,))
            for h in dataset.headers
        ]

    def batch(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        shard, start = self.dataset.windows(b)
        n = self.dataset.seq_len
        pairs = list(zip(shard.tolist(), start.tolist(), strict=True))
        x = torch.stack(
            [torch.from_numpy(self.maps[s][i : i + n].astype(np.int64)) for s, i in pairs]
        )
        y = torch.stack(
            [torch.from_numpy(self.maps[s][i + 1 : i + 1 + n].astype(np.int64)) for s, i in pairs]
        )
        return x, y


def read_everything(paths: list[str]) -> None:
    for path in paths:
        with open(path, "rb") as f:
            while f.read(16 << 20):
                pass


def batches_per_second(fetch: Callable[[int], object], first: int, count: int) -> float:
    start = time.perf_counter()
    for b in range(first, first + count):
        fetch(b)
    return count / (time.perf_counter() - start)


def loader_rounds(paths: list[str], args: argparse.Namespace, cold_ok: bool) -> dict:
    from pyinit.data import TokenShardDataset

    runs: dict[str, list[float]] = {}
    stats: dict = {}
    stretch = 0  # each run reads its own stretch of the epoch, not the one before's
    for _ in range(args.rounds):
        for state in ("cold", "warm") if cold_ok else ("warm",):
            if state == "warm":
                read_everything(paths)
            for name in ("memmap", "pod-init"):
                # Fresh each run: pages a process has mapped survive drop_caches.
                dataset = TokenShardDataset(paths, args.seq_len, 0, 1, batch_size=args.batch)
                loader = MemmapBaseline(dataset) if name == "memmap" else dataset
                if state == "cold":
                    drop_caches()
                first = stretch * args.batches % max(1, len(dataset) - args.batches)
                stretch += 1
                rate = batches_per_second(loader.batch, first, args.batches)
                runs.setdefault(f"{state}/{name}", []).append(rate)
                if name == "pod-init":
                    stats[state] = dataset.reader_stats()
                dataset.close()
                del loader, dataset
    table = {key: statistics.median(values) for key, values in runs.items()}
    for reader_stats in stats.values():
        reader_stats.pop("io_latency_histogram_ns", None)
    return {"runs": runs, "median_batches_per_s": table, "reader_stats": stats}


def sharder_throughput(folder: Path, megabytes: int, interpreted_megabytes: int) -> dict:
    rng = np.random.default_rng(2)
    words = np.array(["the", "of", "and", "to", "in", "data", "node", "gradient", "über", "数据"])

    def jsonl(path: Path, size: int) -> Path:
        with open(path, "w", encoding="utf-8") as f:
            while f.tell() < size:
                text = " ".join(rng.choice(words, rng.integers(50, 600)))
                f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
        return path

    results = {}
    sizes = {"compiled": megabytes, "plain Python": interpreted_megabytes}
    for name, module in kernel_variants().items():
        size = sizes[name]
        source = jsonl(folder / f"sharder-{size}.jsonl", size << 20)
        with kernels.using(module):
            summary = sharder.shard([str(source)], str(folder / f"out-{size}"), 16, force=True)
        results[name] = {
            "input_mb": summary.input_bytes / 1e6,
            "seconds": summary.seconds,
            "mb_per_s": summary.input_bytes / 1e6 / summary.seconds,
        }
    return results


def kernel_variants() -> dict[str, ModuleType]:
    """The compiled loops, and their source run uncompiled where Cython (whose
    pure Python mode the source imports) is installed."""
    variants = {"compiled": kernels.compiled()}
    if installed("cython"):
        variants["plain Python"] = kernels.plain()
    return variants


def window_kernel_cost(paths: list[str], args: argparse.Namespace) -> dict:
    from pyinit.data import TokenShardDataset

    """Microseconds to work out one batch's windows, compiled and as plain Python."""
    dataset = TokenShardDataset(paths, args.seq_len, 0, 1, batch_size=args.batch)
    out = {}
    for name, module in kernel_variants().items():
        with kernels.using(module):
            count = 2000 if module is kernels.compiled() else 20
            start = time.perf_counter()
            for b in range(count):
                dataset.windows(b)
            out[name] = (time.perf_counter() - start) / count * 1e6
    return out


def print_table(document: dict) -> None:
    table = document["loader"]["median_batches_per_s"]
    print(
        f"batch {document['batch']} x {document['seq_len']} tokens, {document['gib']} GiB in "
        f"{document['shards']} shards, median of {document['rounds']} rounds"
    )
    print(f"{'state':6} {'memmap':>10} {'pod-init':>10} {'ratio':>7} {'target':>7}")
    for state, target in (("cold", 3.0), ("warm", 0.8)):
        if f"{state}/memmap" not in table:
            continue
        base, ours = table[f"{state}/memmap"], table[f"{state}/pod-init"]
        print(f"{state:6} {base:10.1f} {ours:10.1f} {ours / base:6.2f}x {target:6.1f}x")
    print("batches per second")
    for name, row in document["sharder"].items():
        print(
            f"sharder, {name} loops: {row['mb_per_s']:.1f} MB/s of input ({row['input_mb']:.0f} MB)"
        )
    for name, us in document["window_kernel_us_per_batch"].items():
        print(f"windows of one batch, {name}: {us:.1f} µs")


def plot(document: dict, path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    table = document["loader"]["median_batches_per_s"]
    states = [s for s in ("cold", "warm") if f"{s}/memmap" in table]
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, name in enumerate(("memmap", "pod-init")):
        ax.bar([x + i * 0.4 for x in range(len(states))], [table[f"{s}/{name}"] for s in states],
               0.4, label=name)  # fmt: skip
    ax.set_xticks([x + 0.2 for x in range(len(states))])
    ax.set_xticklabels(states)
    ax.set_ylabel("batches per second")
    ax.set_yscale("log")
    ax.set_title(f"Batches of {document['batch']} x {document['seq_len']} tokens from shards,\n"
                 f"page cache cold and warm\n{document['machine']}", fontsize="medium")  # fmt: skip
    ax.legend()
    return save_figure(fig, path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", default="/var/tmp/pyinit-bench-data", help="where shards go")
    parser.add_argument("--gib", type=argtypes.size(1 << 20), default=4 << 30, metavar="SIZE",
                        help="total token bytes (default 4G)")  # fmt: skip
    parser.add_argument("--shards", type=argtypes.whole(1, 4096), default=16)
    parser.add_argument("--batch", type=argtypes.whole(1, 1 << 20), default=64)
    parser.add_argument("--seq-len", type=argtypes.whole(1, 1 << 24), default=1024)
    parser.add_argument(
        "--batches", type=argtypes.whole(1, 1 << 30), default=100, help="batches per run"
    )
    parser.add_argument("--rounds", type=argtypes.whole(1, 1000), default=3)
    parser.add_argument("--sharder-mb", type=argtypes.whole(1, 1 << 20), default=64,
                        help="JSONL for the sharder run")  # fmt: skip
    parser.add_argument("--out", default=".", metavar="DIR",
                        help="folder for data.json and data.png")  # fmt: skip
    parser.add_argument(
        "--keep", action="store_true", help="keep the shards in --dir for the next run"
    )


def main(args: argparse.Namespace) -> int:
    folder = Path(args.dir)
    if folder.exists() and not folder.is_dir():
        raise InputError(f"--dir {folder}: exists and is not a folder")
    require("torch", "pyinit bench data")
    note_missing("matplotlib", "the PNG", "pyinit bench data")
    note_missing("cython", "the comparison with uncompiled loops", "pyinit bench data")
    made = not folder.exists()
    fate = "kept: --keep" if args.keep else "removed at the end; --keep keeps them"
    print(f"pyinit bench data: {args.gib / (1 << 30):g} GiB of shards in {folder} ({fate})")
    try:
        return run_benchmark(args, folder)
    finally:
        if not args.keep:
            shutil.rmtree(folder / "shards", ignore_errors=True)
            if made:
                shutil.rmtree(folder, ignore_errors=True)


def run_benchmark(args: argparse.Namespace, folder: Path) -> int:
    paths = make_shards(folder / "shards", args.gib, args.shards)
    cold_ok = drop_caches()
    if not cold_ok:
        print("pyinit bench data: not root, cannot drop the page cache: warm runs only")
    document = {
        "machine": platform.node(),
        "date": time.strftime("%Y-%m-%d"),
        "gib": args.gib / (1 << 30),
        "shards": args.shards,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "rounds": args.rounds,
        "batches_per_run": args.batches,
        "loader": loader_rounds(paths, args, cold_ok),
        "window_kernel_us_per_batch": window_kernel_cost(paths, args),
    }
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        document["sharder"] = sharder_throughput(
            Path(scratch), args.sharder_mb, min(2, args.sharder_mb)
        )
    print_table(document)
    out = Path(args.out)
    write_json(out / "data.json", document)
    if plot(document, out / "data.png"):
        print(f"wrote {out / 'data.json'} and data.png")
    return 0
