"""The token shard format: one file per shard, made to be read with O_DIRECT.

    offset 0      header, 4096 bytes: the fields below, little-endian, then zeros
    offset 4096   token_count tokens of token_bytes each (uint16 or uint32)
    index_offset  document_count + 1 uint64: where each document starts, in
                  tokens (the first is 0, the last token_count)

Tokens start on a 4096-byte boundary, so any window of them is reachable by
aligned direct reads. The index sits after the tokens (at the first multiple
of 8), so a writer streams tokens without knowing their count and writes the
header last: until a shard is renamed to its final name it carries a
temporary one, and a half-written file never has a valid header.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from pyinit.errors import InputError

MAGIC = b"PODTOKS\x00"
VERSION = 2  # 2: the run id
HEADER_BYTES = 4096
# Written last by `pyinit shard`: the set it lists, all of one run, is whole.
MANIFEST = "shards.json"
NO_EOT = 0xFFFFFFFF
# magic, version, token_bytes, token_count, document_count, index_offset,
# vocab_size, eot (NO_EOT: none), shard_index, shard_count, run_id (the same in every
# shard one `pyinit shard` run wrote, so a reader can refuse a set mixed from two runs)
_LAYOUT = struct.Struct("<8sIIQQQIIIIQ")
TOKEN_DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}


def token_bytes_for(vocab_size: int) -> int:
    return 2 if vocab_size <= 1 << 16 else 4


def index_offset(token_count: int, token_bytes: int) -> int:
    end = HEADER_BYTES + token_count * token_bytes
    return (end + 7) // 8 * 8


@dataclass(frozen=True)
class ShardHeader:
    path: str
    token_bytes: int
    token_count: int
    document_count: int
    vocab_size: int
    eot: int | None
    shard_index: int
    shard_count: int
    run_id: int
    version: int = VERSION

    @property
    def dtype(self) -> np.dtype:
        return TOKEN_DTYPES[self.token_bytes]

    @property
    def index_offset(self) -> int:
        return index_offset(self.token_count, self.token_bytes)

    @property
    def file_size(self) -> int:
        return self.index_offset + (self.document_count + 1) * 8

    def pack(self) -> bytes:
        eot = NO_EOT if self.eot is None else self.eot
        fields = _LAYOUT.pack(
            MAGIC,
            self.version,
            self.token_bytes,
            self.token_count,
            self.document_count,
            self.index_offset,
            self.vocab_size,
            eot,
            self.shard_index,
            self.shard_count,
            self.run_id,
        )
        return fields.ljust(HEADER_BYTES, b"\0")


def _refuse(path: str, reason: str) -> InputError:
    return InputError(f"{path}: not a usable token shard: {reason}")


def read_header(path: str | os.PathLike[str]) -> ShardHeader:
    """The header of a shard, checked against the file: InputError naming the
    path and the reason when the magic, version, token size or the sizes the
    header implies do not fit; OSError when the file cannot be read."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        raw = f.read(HEADER_BYTES)
        size = os.fstat(f.fileno()).st_size
        if len(raw) < _LAYOUT.size:
            raise _refuse(path, f"{size} bytes, shorter than the header")
        (magic, version, token_bytes, tokens, documents, at, vocab, eot, index, count, run) = (
            _LAYOUT.unpack_from(raw)
        )
        if magic != MAGIC:
            raise _refuse(path, f"bad magic {magic!r} (expected {MAGIC!r})")
        if version != VERSION:
            raise _refuse(path, f"format version {version}; this pod-init reads {VERSION}")
        if token_bytes not in TOKEN_DTYPES:
            raise _refuse(path, f"token size {token_bytes} bytes (2 or 4 expected)")
        header = ShardHeader(
            path,
            token_bytes,
            tokens,
            documents,
            vocab,
            None if eot == NO_EOT else eot,
            index,
            count,
            run,
        )
        if at != header.index_offset:
            raise _refuse(
                path, f"index offset {at} disagrees with {tokens} tokens ({header.index_offset})"
            )
        if size != header.file_size:
            what = "truncated" if size < header.file_size else "longer than its header says"
            raise _refuse(
                path,
                f"{what}: {size} bytes, the header ({tokens} tokens, {documents} documents) "
                f"makes {header.file_size}",
            )
        f.seek(header.index_offset)
        starts = np.frombuffer(f.read((documents + 1) * 8), dtype="<u8")
    if starts[0] != 0 or starts[-1] != tokens or np.any(np.diff(starts.astype(np.int64)) < 0):
        raise _refuse(path, "the document index does not run from 0 to the token count in order")
    return header


def read_document_starts(header: ShardHeader) -> np.ndarray:
    """Where each document starts (in tokens), plus the token count at the end."""
    with open(header.path, "rb") as f:
        f.seek(header.index_offset)
        return np.frombuffer(f.read((header.document_count + 1) * 8), dtype="<u8").copy()


def temporary_name(final: Path) -> Path:
    """Where a shard is written before it is whole: a hidden name carrying the
    writer's process id, so a later run can tell a dead run's leftovers."""
    return final.with_name(f".{final.name}.tmp-{os.getpid()}")


def dead_temporaries(folder: Path) -> list[Path]:
    """Temporary shards whose writer no longer runs (a run killed or crashed)."""
    found = []
    for path in folder.glob(".shard-*.tok.tmp-*"):
        pid = path.name.rpartition("-")[2]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            found.append(path)
        except PermissionError:
            pass  # another user's live process
    return sorted(found)


class ShardWriter:
    """Streams one shard to a temporary file beside its final name. finish()
    writes the index and the header and syncs; publish() renames, so a caller
    with several shards publishes them only once all are finished. A failing
    write (a full disk) is an OSError naming the temporary file."""

    def __init__(
        self,
        final: Path,
        token_bytes: int,
        vocab_size: int,
        eot: int | None,
        shard_index: int,
        shard_count: int,
        run_id: int,
    ):
        self.final = final
        self.temp = temporary_name(final)
        self._file: BinaryIO = open(self.temp, "wb")  # noqa: SIM115 - closed in commit/discard
        # The set's id, written into the header by finish(): a caller that derives
        # it from the content (the sharder) sets it once every shard is filled.
        self.run_id = run_id
        self.content = hashlib.blake2b(digest_size=16)  # the tokens and documents, in order
        with self._naming_errors():
            self._file.write(bytes(HEADER_BYTES))
        self._dtype = TOKEN_DTYPES[token_bytes]
        self._token_bytes = token_bytes
        self._vocab_size = vocab_size
        self._eot = eot
        self._shard = (shard_index, shard_count)
        self._document_lengths: list[np.ndarray] = []
        self.token_count = 0
        self.document_count = 0

    @contextlib.contextmanager
    def _naming_errors(self) -> Iterator[None]:
        try:
            yield
        except OSError as e:
            if e.filename is not None:
                raise
            raise OSError(e.errno, e.strerror, str(self.temp)) from None

    def append(self, tokens: np.ndarray, document_lengths: np.ndarray) -> None:
        """Documents laid end to end: their tokens and how many each has."""
        data = tokens.astype(self._dtype, copy=False).tobytes()
        self.content.update(data)
        self.content.update(document_lengths.astype("<u8").tobytes())
        with self._naming_errors():
            self._file.write(data)
        self._document_lengths.append(document_lengths.astype(np.uint64))
        self.token_count += int(tokens.size)
        self.document_count += int(document_lengths.size)

    def finish(self) -> None:
        header = ShardHeader(
            str(self.final),
            self._token_bytes,
            self.token_count,
            self.document_count,
            self._vocab_size,
            self._eot,
            *self._shard,
            self.run_id,
        )
        lengths = np.concatenate([np.zeros(1, np.uint64), *self._document_lengths])
        f = self._file
        with self._naming_errors():
            f.write(bytes(header.index_offset - f.tell()))
            f.write(np.cumsum(lengths, dtype=np.uint64).astype("<u8").tobytes())
            f.seek(0)
            f.write(header.pack())
            f.flush()
            os.fsync(f.fileno())
            f.close()

    def publish(self) -> None:
        os.replace(self.temp, self.final)

    def discard(self) -> None:
        with contextlib.suppress(OSError):  # a full disk may fail the close's flush too
            self._file.close()
        self.temp.unlink(missing_ok=True)
