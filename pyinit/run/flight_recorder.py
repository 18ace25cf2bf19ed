"""PyTorch's NCCL flight recorder, as the stall watch uses it: turned on for
a watched run (``flight_recorder_env``), asked for a dump through the pipe
files torch watches (``TORCH_NCCL_DEBUG_INFO_PIPE_FILE``), and its dumps read
for what a stall needs (``read_flight_recorder``): the last collective each
rank reached, and the first it has not completed."""

from __future__ import annotations

import glob
import os
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

PIPE_PREFIX = "flight-recorder-pipe-rank_"
TEMP_FILE_ENV = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
PIPE_FILE_ENV = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"


def flight_recorder_env(run_dir: Path, status_dir: Path) -> dict[str, str]:
    """PyTorch's NCCL flight recorder on, dumped on request into RUN_DIR
    (unless the user's environment names other places, which the watch then uses)."""
    (run_dir / "flight-recorder").mkdir(parents=True, exist_ok=True)
    return {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        TEMP_FILE_ENV: str(run_dir / "flight-recorder" / "rank_"),
        PIPE_FILE_ENV: str(status_dir / PIPE_PREFIX),
    }


@dataclass(frozen=True)
class Traced:
    """A rank's NCCL flight recorder, as far as a stall needs it."""

    last_seq: int  # the highest collective sequence number it reached
    pending: str | None  # the first collective not completed ("nccl:all_reduce #11")


class _PlainUnpickler(pickle.Unpickler):
    """torch's dump holds dicts, lists and scalars only: refuse anything else."""

    def find_class(self, module: str, name: str) -> NoReturn:
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


def read_flight_recorder(paths: list[Path], prefix: str = "rank_") -> dict[int, Traced]:
    """Each dump (PREFIX + rank, RUN_DIR/flight-recorder/rank_N by default)
    that reads as torch writes it."""
    traced = {}
    for path in paths:
        try:
            with path.open("rb") as f:
                entries = _PlainUnpickler(f).load()["entries"]
            rank = int(path.name.removeprefix(prefix))
        except (OSError, ValueError, KeyError, TypeError, pickle.UnpicklingError, EOFError):
            continue
        seqs = [e["collective_seq_id"] for e in entries]
        pending = [e for e in entries if e.get("state") != "completed"]
        first = (
            f"{pending[0]['profiling_name']} #{pending[0]['collective_seq_id']}"
            if pending
            else None
        )
        traced[rank] = Traced(max(seqs, default=0), first)
    return traced


def _stamp(path: Path) -> tuple[int, int]:
    try:
        st = path.stat()
    except OSError:
        return (0, 0)
    return (st.st_mtime_ns, st.st_size)


@dataclass(frozen=True)
class FlightRecorder:
    """Where torch writes a run's dumps (PREFIX + rank) and watches its pipes:
    the run's own places, or those the user's environment names."""

    dump_prefix: Path
    pipe_prefix: Path

    @classmethod
    def of_run(cls, run_dir: Path, status_dir: Path, env: Mapping[str, str]) -> FlightRecorder:
        return cls(Path(env.get(TEMP_FILE_ENV, run_dir / "flight-recorder" / "rank_")),
                   Path(env.get(PIPE_FILE_ENV, status_dir / PIPE_PREFIX)))  # fmt: skip

    def dumps(self) -> list[Path]:
        folder, prefix = self.dump_prefix.parent, self.dump_prefix.name
        return sorted(folder.glob(f"{glob.escape(prefix)}*")) if folder.is_dir() else []

    def stamps(self) -> dict[Path, tuple[int, int]]:
        """The dumps there now (an earlier stall's, a reused --run-dir's, the
        user's folder's): (mtime_ns, size) each."""
        return {path: _stamp(path) for path in self.dumps()}

    def new_dumps(self, before: dict[Path, tuple[int, int]]) -> list[Path]:
        """The dumps written since `before` was stamped, not empty."""
        return [p for p in self.dumps() if _stamp(p) != before.get(p) and _stamp(p)[1] > 0]

    def request(self) -> int:
        """A byte into each rank's pipe: torch dumps its NCCL trace (NCCL only).
        Returns how many ranks were asked."""
        asked = 0
        folder, prefix = self.pipe_prefix.parent, self.pipe_prefix.name
        for pipe in folder.glob(f"{glob.escape(prefix)}*.pipe") if folder.is_dir() else []:
            try:
                fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no reader: that rank's group is gone or not NCCL
                continue
            try:
                os.write(fd, b"1")
                asked += 1
            finally:
                os.close(fd)
        return asked

    def read(self, paths: list[Path]) -> dict[int, Traced]:
        return read_flight_recorder(paths, self.dump_prefix.name)
