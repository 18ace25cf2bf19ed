"""``pyinit shard``: JSON Lines or text in, token shards out.

Each record goes to the shard picked by a hash of its text (FNV-1a 64 of the
UTF-8 bytes, mixed, modulo the shard count): the same input makes the same
shards on any machine, whatever order the files are given in. Records are
handled in chunks: decoding and tokenizing in Python (or in the tokenizers
package), hashing and grouping by shard in compiled loops (pyinit.data._kernels).
Nothing appears under the final names until every shard is complete.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import os
import resource
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

import numpy as np

from pyinit.data import _kernels
from pyinit.data.shard_format import MANIFEST, ShardWriter, dead_temporaries, token_bytes_for
from pyinit.errors import InputError
from pyinit.extras import require
from pyinit.jsonfile import parse_json, read_input, sync_directory, write_json

FORMATS = ("jsonl", "text")
CHUNK_RECORDS = 4096
CHUNK_BYTES = 4 << 20
PROGRESS_EVERY_S = 2.0
# One record is one line: a longer one is no document (a binary file, /dev/zero),
# and reading it whole would take the machine's memory first.
MAX_LINE_BYTES = 256 << 20
# The largest tokenizer.json files published are tens of MiB (vocabularies of
# 256 k tokens with their merges); a file past this is not one.
TOKENIZER_LIMIT = 256 << 20
# End-of-text tokens that tokenizer.json files commonly define, most common first.
EOT_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "[SEP]")


def shard_name(index: int, count: int) -> str:
    return f"shard-{index:05d}-of-{count:05d}.tok"


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    eot: int | None

    def encode(self, texts: list[str], blobs: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """(uint32 tokens of all records end to end, int64 start offsets + end)."""
        ...


class ByteTokenizer:
    """Token = byte of the UTF-8 text; 256 ends a document. Needs nothing."""

    name = "byte"
    vocab_size = 257
    eot = 256

    def encode(self, texts: list[str], blobs: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        tokens = np.frombuffer(b"".join(blobs), dtype=np.uint8).astype(np.uint32)
        return tokens, _offsets([len(b) for b in blobs])


class HuggingFaceTokenizer:
    """A tokenizer.json through the tokenizers package (batch encoding in Rust)."""

    def __init__(self, path: str):
        # The path first: a mistyped one is said before the package is asked for.
        try:
            data = read_input(path, limit=TOKENIZER_LIMIT)
        except FileNotFoundError:
            raise FileNotFoundError(
                errno.ENOENT, "no such tokenizer file (give 'byte' or a tokenizer.json)", path
            ) from None
        require("tokenizers", f"pyinit shard --tokenizer {path}")
        from tokenizers import Tokenizer as HfTokenizer

        try:
            self._tokenizer = HfTokenizer.from_str(data.decode())
        except Exception as e:  # the package raises a bare Exception for bad files
            reason = "not UTF-8" if isinstance(e, UnicodeDecodeError) else e
            raise InputError(
                f"not a tokenizer.json the tokenizers package reads: {reason}", file=path
            ) from None
        self.name = f"{path} (sha256 {hashlib.sha256(data).hexdigest()[:16]})"
        self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        found = (self._tokenizer.token_to_id(name) for name in EOT_NAMES)
        self.eot = next((token for token in found if token is not None), None)

    def encode(self, texts: list[str], blobs: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        encodings = self._tokenizer.encode_batch(texts, add_special_tokens=False)
        ids = [np.asarray(e.ids, dtype=np.uint32) for e in encodings]
        tokens = np.concatenate(ids) if ids else np.zeros(0, np.uint32)
        return tokens, _offsets([len(i) for i in ids])


def _offsets(lengths: list[int]) -> np.ndarray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def load_tokenizer(spec: str) -> Tokenizer:
    return ByteTokenizer() if spec == "byte" else HuggingFaceTokenizer(spec)


@dataclass
class ShardSummary:
    out_dir: str
    shard_count: int
    records: int = 0
    skipped: int = 0
    input_bytes: int = 0
    tokens: int = 0
    seconds: float = 0.0
    tokenizer: str = ""
    eot: int | None = None
    shards: list[dict] = field(default_factory=list)
    skipped_examples: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    removed_temporaries: int = 0  # a killed run's leftovers, found and removed

    def to_text(self) -> str:
        counts = sorted(s["tokens"] for s in self.shards)
        empty = sum(1 for c in counts if c == 0)
        mb = self.input_bytes / 1e6
        rate = mb / self.seconds if self.seconds > 0 else float("inf")
        lines = [
            f"{self.records:,} records ({mb:,.1f} MB) -> {self.tokens:,} tokens in "
            f"{self.shard_count} shards under {self.out_dir}",
            f"tokenizer {self.tokenizer}, end of text "
            + ("none (documents run together)" if self.eot is None else f"token {self.eot}"),
            f"tokens per shard: min {counts[0]:,}, median {counts[len(counts) // 2]:,}, "
            f"max {counts[-1]:,}" + (f"; {empty} shards are empty" if empty else ""),
            f"{self.seconds:.2f} s, {rate:,.1f} MB/s of input",
        ]
        if self.skipped:
            lines.append(
                f"skipped {self.skipped:,} invalid lines, first: {self.skipped_examples[0]}"
            )
        if self.removed_temporaries:
            lines.append(
                f"removed {self.removed_temporaries} temporary shard files of an interrupted run"
            )
        if self.replaced:
            lines.append(f"replaced {len(self.replaced)} shard files from an earlier run")
        return "\n".join(lines) + "\n"


class _Progress:
    """A line on stderr every few seconds, so short inputs print nothing."""

    def __init__(self, stream: IO[str] | None, total_bytes: int):
        self._stream = stream
        self._total = total_bytes
        self._every = PROGRESS_EVERY_S
        self._start = self._last = time.monotonic()

    def update(self, done_bytes: int, records: int) -> None:
        now = time.monotonic()
        if self._stream is None or now - self._last < self._every:
            return
        self._last = now
        rate = done_bytes / 1e6 / (now - self._start)
        share = f" ({100 * done_bytes / self._total:.0f}%)" if self._total else ""
        self._stream.write(
            f"pyinit shard: {done_bytes / 1e6:,.0f} MB{share}, {records:,} records, "
            f"{rate:,.0f} MB/s\n"
        )
        self._stream.flush()


class _Input:
    """An input's lines, and how far into the file (compressed bytes for .gz)
    they have come, so progress runs against the file's own size."""

    def __init__(self, path: str):
        self._file = open(path, "rb")  # noqa: SIM115 - closed in close()
        self.lines: IO[bytes] = (
            gzip.GzipFile(fileobj=self._file) if path.endswith(".gz") else (self._file)
        )
        self._seen = 0

    def numbered(self) -> Iterator[tuple[int, bytes | None, int]]:
        """(line number, the line, bytes of the file it took (for .gz: how
        far the file was read)); the line is None where it was longer than
        MAX_LINE_BYTES, whose rest is read past, without being kept, only
        when the caller asks for the next line."""
        number, carried = 0, 0
        while raw := self.lines.readline(MAX_LINE_BYTES + 1):
            number += 1
            overlong = len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n")
            yield number, None if overlong else raw, self._consumed(carried + len(raw))
            carried = 0
            while overlong and (part := self.lines.readline(CHUNK_BYTES)):
                carried += len(part)
                overlong = not part.endswith(b"\n")

    def _consumed(self, length: int) -> int:
        if self.lines is self._file:
            return length
        position = self._file.tell()
        step, self._seen = position - self._seen, position
        return step

    def close(self) -> None:
        self.lines.close()
        self._file.close()


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    kinds = {bool: "a boolean", int: "a number", float: "a number", list: "an array"}
    return kinds.get(type(value), "a string" if isinstance(value, str) else "an object")


def _record_text(raw: bytes, fmt: str, text_field: str) -> str:
    """The text of one line; ValueError saying what is wrong with it."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})") from None
    if fmt == "text":
        return line.rstrip("\r\n")
    record = parse_json(line)
    if not isinstance(record, dict):
        raise ValueError(f"{_json_kind(record)}, not a JSON object")
    if text_field not in record:
        raise ValueError(f"no field {text_field!r}")
    text = record[text_field]
    if not isinstance(text, str):
        raise ValueError(f"field {text_field!r} is {_json_kind(text)}, not a string")
    return text


def _records(
    path: str, fmt: str, text_field: str, skip_invalid: bool, summary: ShardSummary
) -> Iterator[tuple[str | None, bytes, int]]:
    """(text, its UTF-8 bytes, input bytes consumed) per line; text is None for
    lines that make no record (blank, or invalid and skipped)."""
    source = _Input(path)
    try:
        try:
            for number, raw, consumed in source.numbered():
                if raw is not None and not raw.strip():
                    yield None, b"", consumed
                    continue
                try:
                    if raw is None:
                        raise ValueError(f"longer than {MAX_LINE_BYTES >> 20} MiB: not a line of "
                                         "text (one record a line)")  # fmt: skip
                    text = _record_text(raw, fmt, text_field)
                    blob = text.encode("utf-8")
                except UnicodeEncodeError:
                    problem = "holds an unpaired surrogate escape, which is not Unicode text"
                    error = ValueError(f"field {text_field!r} {problem}")
                except ValueError as e:
                    error = e
                else:
                    yield text, blob, consumed
                    continue
                where = f"{path}:{number}: {error}"
                if not skip_invalid:
                    raise InputError(f"{where} (--skip-invalid skips such lines)")
                summary.skipped += 1
                if len(summary.skipped_examples) < 5:
                    summary.skipped_examples.append(where)
                yield None, b"", consumed
        except (gzip.BadGzipFile, EOFError, zlib.error) as e:
            # zlib.error: a deflate stream with bytes zeroed or cut inside it.
            raise InputError(f"{path}: damaged gzip stream: {e}") from None
    finally:
        source.close()


def _existing_shards(out_dir: Path) -> list[Path]:
    found = sorted(out_dir.glob("shard-*.tok"))
    manifest = out_dir / MANIFEST
    return found + ([manifest] if manifest.exists() else [])


def shard(
    inputs: Sequence[str],
    out_dir: str,
    shard_count: int,
    text_field: str = "text",
    tokenizer: str = "byte",
    fmt: str = "jsonl",
    skip_invalid: bool = False,
    force: bool = False,
    progress: IO[str] | None = None,
) -> ShardSummary:
    """Shards `inputs` into `out_dir`. InputError for bad input or arguments
    (nothing is written), OSError when a file cannot be read or written."""
    out, total_bytes, earlier = _checked_arguments(inputs, out_dir, shard_count, fmt, force)
    tok = load_tokenizer(tokenizer)
    token_bytes = token_bytes_for(tok.vocab_size)
    _open_files_for(shard_count)
    summary = ShardSummary(str(out), shard_count, tokenizer=tok.name, eot=tok.eot)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    for leftover in dead_temporaries(out):
        leftover.unlink(missing_ok=True)
        summary.removed_temporaries += 1
    start = time.monotonic()
    writers = _write_shards(inputs, out, created, tok, token_bytes, summary,
                            _Progress(progress, total_bytes), text_field, fmt,
                            skip_invalid)  # fmt: skip
    run_id = writers[0].run_id
    # One publish step that readers can tell from a whole set: the old manifest goes
    # first (the folder no longer holds a whole set), the shards take their names,
    # and the new manifest, naming this run, comes last.
    (out / MANIFEST).unlink(missing_ok=True)
    sync_directory(out)
    for writer in writers:
        writer.publish()
    summary.seconds = time.monotonic() - start
    summary.shards = [
        {"file": w.final.name, "tokens": w.token_count, "documents": w.document_count}
        for w in writers
    ]
    summary.tokens = sum(w.token_count for w in writers)
    new_names = {w.final.name for w in writers} | {MANIFEST}
    for stale in earlier:
        if stale.name not in new_names:
            stale.unlink(missing_ok=True)
    _write_manifest(out, inputs, text_field, fmt, token_bytes, run_id, summary)
    summary.replaced = [p.name for p in earlier if p.name != MANIFEST]
    return summary


def _checked_arguments(
    inputs: Sequence[str], out_dir: str, shard_count: int, fmt: str, force: bool
) -> tuple[Path, int, list[Path]]:
    """Every check before anything is written: the output folder, the input
    files' total size, and the shard files already there."""
    if shard_count < 1:
        raise InputError(f"--shards must be at least 1, not {shard_count}")
    if fmt not in FORMATS:
        raise InputError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if not inputs:
        raise InputError("no input files")
    total_bytes = 0
    for path in inputs:
        if os.path.isdir(path):
            raise IsADirectoryError(errno.EISDIR, "an input must be a file", path)
        total_bytes += os.path.getsize(path)  # OSError naming the input when it is not there
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a directory")
    earlier = _existing_shards(out) if out.is_dir() else []
    if earlier and not force:
        shards = [p for p in earlier if p.name != MANIFEST]
        held = f"{len(shards)} shards (e.g. {shards[0].name})" if shards else "no shard"
        manifest = f" and {MANIFEST}" if len(shards) < len(earlier) else ""
        raise InputError(f"{out}: already holds {held}{manifest}; pass --force to replace them")
    return out, total_bytes, earlier


def _write_shards(inputs: Sequence[str], out: Path, created: bool, tok: Tokenizer, token_bytes: int,
                  summary: ShardSummary, progress: _Progress, text_field: str,
                  fmt: str, skip_invalid: bool) -> list[ShardWriter]:  # fmt: skip
    """Every record into the shards' hidden files, finished (synced) but not
    yet named; on any failure, nothing is left and a folder this run made is gone."""
    shard_count = summary.shard_count
    writers: list[ShardWriter] = []
    try:
        for i in range(shard_count):
            final = out / shard_name(i, shard_count)
            writers.append(
                ShardWriter(final, token_bytes, tok.vocab_size, tok.eot, i, shard_count, 0)
            )
        _fill(inputs, fmt, text_field, skip_invalid, tok, writers, summary, progress)
        if summary.records == 0:
            raise InputError(
                f"no records in {', '.join(inputs)}"
                + (f" ({summary.skipped} invalid lines skipped)" if summary.skipped else "")
            )
        if summary.records < shard_count:
            raise InputError(
                f"{shard_count} shards for {summary.records} records: "
                "ask for at most as many shards as there are records"
            )
        # The same inputs and options give the same id, so the same bytes; shards
        # of a different set still carry a different one, and are refused together.
        run_id = set_id(writers, f"{tok.name}/{tok.vocab_size}/{tok.eot}/{token_bytes}/{fmt}/"
                        f"{text_field}/{skip_invalid}")  # fmt: skip
        for writer in writers:
            writer.run_id = run_id
            writer.finish()
    except BaseException:
        for writer in writers:
            writer.discard()
        if created:
            with contextlib.suppress(OSError):  # a folder this run made holds nothing now
                out.rmdir()
        raise
    return writers


def set_id(writers: Sequence[ShardWriter], options: str) -> int:
    """A set's run id from what it holds: the options, then each shard's tokens."""
    digest = hashlib.blake2b(options.encode(), digest_size=8)
    for writer in writers:
        digest.update(writer.content.digest())
    return int.from_bytes(digest.digest(), "little")


def _open_files_for(shard_count: int) -> None:
    """Every shard is open while records stream in: raise the soft limit on open
    files as far as the hard one allows, and refuse a count beyond it up front."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = shard_count + 64  # the inputs, the interpreter's own, some slack
    if needed <= soft:
        return
    if hard != resource.RLIM_INFINITY and needed > hard:
        raise InputError(
            f"--shards {shard_count} keeps {shard_count} files open, and this process may "
            f"open at most {hard} (ulimit -n); ask for fewer shards"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def _fill(inputs, fmt, text_field, skip_invalid, tok, writers, summary, progress) -> None:
    texts: list[str] = []
    blobs: list[bytes] = []
    pending = 0
    for path in inputs:
        for text, blob, consumed in _records(path, fmt, text_field, skip_invalid, summary):
            summary.input_bytes += consumed
            if text is None:
                continue
            texts.append(text)
            blobs.append(blob)
            pending += len(blob)
            if len(blobs) >= CHUNK_RECORDS or pending >= CHUNK_BYTES:
                _write_chunk(texts, blobs, tok, writers)
                summary.records += len(blobs)
                texts, blobs, pending = [], [], 0
                progress.update(summary.input_bytes, summary.records)
    if blobs:
        _write_chunk(texts, blobs, tok, writers)
        summary.records += len(blobs)


def _write_chunk(texts: list[str], blobs: list[bytes], tok: Tokenizer, writers) -> None:
    data = np.frombuffer(b"".join(blobs), dtype=np.uint8)
    shard_of = _kernels.shard_of_records(
        memoryview(data), memoryview(_offsets([len(b) for b in blobs])), len(writers)
    )
    tokens, doc_offsets = tok.encode(texts, blobs)
    eot = -1 if tok.eot is None else tok.eot
    grouped, token_ends, lengths, doc_ends = _kernels.group_by_shard(
        memoryview(tokens), memoryview(doc_offsets), memoryview(shard_of), len(writers), eot
    )
    for s, writer in enumerate(writers):
        if doc_ends[s + 1] > doc_ends[s]:
            writer.append(
                grouped[token_ends[s] : token_ends[s + 1]], lengths[doc_ends[s] : doc_ends[s + 1]]
            )


def _write_manifest(out: Path, inputs, text_field, fmt, token_bytes, run_id, summary) -> None:
    manifest = {
        "format": "pod-init token shards",
        "version": 2,
        "run_id": f"{run_id:016x}",
        "shard_count": summary.shard_count,
        "tokenizer": summary.tokenizer,
        "token_bytes": token_bytes,
        "eot": summary.eot,
        "field": text_field if fmt == "jsonl" else None,
        "input_format": fmt,
        "inputs": [{"path": os.path.abspath(p), "bytes": os.path.getsize(p)} for p in inputs],
        "records": summary.records,
        "skipped_lines": summary.skipped,
        "tokens": summary.tokens,
        "shards": summary.shards,
    }
    write_json(out / MANIFEST, manifest)
