"""`pyinit shard` and the shard format: every record in exactly one shard,
stable assignment, token counts that add up, the Hugging Face tokenizer path,
bad input with file and line, and nothing half-written."""

from __future__ import annotations

import gzip
import io
import itertools
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import run
from hypothesis import given, settings
from hypothesis import strategies as st

from pyinit.data import _kernels, sharder
from pyinit.data.shard_format import HEADER_BYTES, read_document_starts, read_header
from pyinit.data.sharder import shard, shard_name

TEXTS = [f"record {i}: " + "héllo wörld 漢字 " * (i % 7) for i in range(500)]


def write_jsonl(path: Path, texts: list[str], extra: str = "") -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for i, text in enumerate(texts):
            f.write(json.dumps({"id": i, "text": text}, ensure_ascii=False) + "\n")
        f.write(extra)
    return path


def documents(out: Path) -> dict[str, list[np.ndarray]]:
    """Each shard's documents as token arrays, read back through the index."""
    found = {}
    for path in sorted(out.glob("shard-*.tok")):
        header = read_header(path)
        tokens = np.fromfile(
            path, dtype=header.dtype, count=header.token_count, offset=HEADER_BYTES
        )
        starts = read_document_starts(header)
        found[path.name] = [tokens[a:b] for a, b in itertools.pairwise(starts)]
    return found


def test_every_record_lands_in_exactly_one_shard(tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", TEXTS, extra="\n   \n")  # blank lines: no records
    summary = shard([str(source)], str(tmp_path / "out"), 7)
    assert summary.records == len(TEXTS) and summary.skipped == 0
    shards = documents(tmp_path / "out")
    assert sorted(shards) == [shard_name(i, 7) for i in range(7)]
    texts = []
    for docs in shards.values():
        for doc in docs:
            assert doc[-1] == 256  # the byte tokenizer's end of text
            texts.append(doc[:-1].astype(np.uint8).tobytes().decode("utf-8"))
    assert sorted(texts) == sorted(TEXTS)
    produced = sum(len(t.encode()) + 1 for t in TEXTS)
    headers = [read_header(p) for p in sorted((tmp_path / "out").glob("*.tok"))]
    assert sum(h.token_count for h in headers) == produced == summary.tokens
    assert sum(h.document_count for h in headers) == len(TEXTS)
    assert all(h.vocab_size == 257 and h.token_bytes == 2 and h.shard_count == 7 for h in headers)
    manifest = json.loads((tmp_path / "out" / "shards.json").read_text())
    assert manifest["records"] == len(TEXTS) and manifest["tokens"] == produced
    assert not list((tmp_path / "out").glob(".*"))  # no temporary files left


def test_the_same_input_and_options_give_the_same_bytes(tmp_path):
    """The run id was random, so two runs of one command differed byte for byte."""
    source = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    for folder in ("one", "two"):
        shard([str(source)], str(tmp_path / folder), 3)
    three = shard([str(source)], str(tmp_path / "three"), 3, skip_invalid=True)
    for i in range(3):
        name = shard_name(i, 3)
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
        # Another option, another set: the tokens agree, the header's id does not.
        assert (tmp_path / "one" / name).read_bytes() != (tmp_path / "three" / name).read_bytes()
    assert three.records == len(TEXTS)


def test_assignment_is_stable_across_runs_and_input_order(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", TEXTS[:250])
    b = write_jsonl(tmp_path / "b.jsonl", TEXTS[250:])
    shard([str(a), str(b)], str(tmp_path / "one"), 5)
    shard([str(b), str(a)], str(tmp_path / "two"), 5)
    for i in range(5):
        one = {d.tobytes() for d in documents(tmp_path / "one")[shard_name(i, 5)]}
        two = {d.tobytes() for d in documents(tmp_path / "two")[shard_name(i, 5)]}
        assert one == two
    # Pinned: the hash is part of the format and must not drift between versions. FNV-1a-64
    # of "hello" is the published 0xa430d84680aabd0b; these are mix64 of it (and of
    # "world!") modulo 2**30, computed by hand from the README's formula.
    data = np.frombuffer(b"hello" + b"world!", dtype=np.uint8)
    offsets = np.array([0, 5, 11], dtype=np.int64)
    assert _kernels.shard_of_records(data, offsets, 1 << 30).tolist() == [123456783, 758109302]


def test_the_kernels_are_compiled_and_agree_with_their_python_source():
    from pyinit.data import kernels

    assert Path(kernels.compiled().__file__).suffix == ".so"
    source = kernels.plain()

    @settings(max_examples=30, deadline=None)
    @given(
        st.lists(st.binary(max_size=40), min_size=1, max_size=30),
        st.integers(1, 9),
        st.integers(1, 5000),
        st.integers(0, 2**64 - 1),
    )
    def agree(blobs, shards, windows, key):
        data = np.frombuffer(b"".join(blobs) or b"\0", dtype=np.uint8)
        offsets = np.concatenate([[0], np.cumsum([len(b) for b in blobs])]).astype(np.int64)
        args = (memoryview(data), memoryview(offsets), shards)
        compiled = _kernels.shard_of_records(*args)
        assert np.array_equal(compiled, source.shard_of_records(*args))
        tokens = data.astype(np.uint32)
        group = (memoryview(tokens), memoryview(offsets), memoryview(compiled), shards, 256)
        for x, y in zip(
            _kernels.group_by_shard(*group), source.group_by_shard(*group), strict=True
        ):
            assert np.array_equal(x, y)
        ends = np.array([0, windows // 3, windows // 3, windows], dtype=np.int64)
        positions = np.arange(windows, dtype=np.int64)
        where = (memoryview(positions[:50]), windows, key, memoryview(ends))
        for x, y in zip(
            _kernels.permuted_windows(*where), source.permuted_windows(*where), strict=True
        ):
            assert np.array_equal(x, y)
        # A permutation: every window once.
        shard_of, local = _kernels.permuted_windows(positions, windows, key, ends)
        assert np.array_equal(np.sort(ends[shard_of] + local), positions)

    agree()


def test_hugging_face_tokenizer_json(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]", "<|endoftext|>"])
    tokenizer.train_from_iterator(TEXTS, trainer)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    source = write_jsonl(tmp_path / "in.jsonl", TEXTS)
    summary = shard(
        [str(source)], str(tmp_path / "out"), 3, tokenizer=str(tmp_path / "tokenizer.json")
    )
    eot = tokenizer.token_to_id("<|endoftext|>")
    assert summary.eot == eot and "sha256" in summary.tokenizer
    expected = sorted(tuple(tokenizer.encode(t, add_special_tokens=False).ids) for t in TEXTS)
    got = []
    for docs in documents(tmp_path / "out").values():
        for doc in docs:
            assert doc[-1] == eot
            got.append(tuple(doc[:-1].tolist()))
    assert sorted(got) == expected


def test_text_format_and_gzip_input(tmp_path):
    lines = ["first line", "", "second line", "third"]
    with gzip.open(tmp_path / "in.txt.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    summary = shard([str(tmp_path / "in.txt.gz")], str(tmp_path / "out"), 2, fmt="text")
    assert summary.records == 3
    texts = sorted(
        d[:-1].astype(np.uint8).tobytes().decode() for docs in documents(tmp_path / "out").values()
        for d in docs
    )  # fmt: skip
    assert texts == ["first line", "second line", "third"]


BAD_LINES = [
    ('{"text": "a"', "malformed JSON: Expecting ',' delimiter"),
    ('{"body": "a"}', "no field 'text'"),
    ('{"text": null}', "field 'text' is null, not a string"),
    ('["text"]', "an array, not a JSON object"),
    ('{"text": "\\ud800"}', "unpaired surrogate"),
    (b'{"text": "caf\xe9"}', "not UTF-8 (byte 0xe9 at column 14)"),
]


@pytest.mark.parametrize(("line", "message"), BAD_LINES)
def test_bad_line_names_file_and_line(tmp_path, pyinit_bin, line, message):
    source = tmp_path / "in.jsonl"
    good = [json.dumps({"text": t}).encode() for t in TEXTS[:3]]
    bad = line if isinstance(line, bytes) else line.encode()
    source.write_bytes(b"\n".join([*good, bad, *good]) + b"\n")
    result = run([pyinit_bin, "shard", source, "--out", tmp_path / "out", "--shards", "2"])
    assert result.returncode == 2, result.stderr
    assert f"{source}:4: " in result.stderr and message in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())

    skipped = run([pyinit_bin, "shard", source, "--out", tmp_path / "out", "--shards", "2",
                   "--skip-invalid"])  # fmt: skip
    assert skipped.returncode == 0, skipped.stderr
    assert "6 records" in skipped.stdout and "skipped 1 invalid lines" in skipped.stdout
    assert f"{source}:4: " in skipped.stdout


@pytest.mark.parametrize("gzipped", [False, True])
def test_a_line_past_the_limit_is_bad_input_not_a_memory_error(tmp_path, monkeypatch, gzipped):
    """A line is one record: one longer than MAX_LINE_BYTES (a binary file,
    /dev/zero) is refused naming its line, never read whole; skipped, its
    rest is read past in parts and the next line is a record again."""
    monkeypatch.setattr(sharder, "MAX_LINE_BYTES", 1 << 20)
    monkeypatch.setattr(sharder, "CHUNK_BYTES", 100_000)
    good = [json.dumps({"text": t}).encode() for t in TEXTS[:3]]
    data = b"\n".join([*good, b"x" * (3 << 20), *good]) + b"\n"
    source = tmp_path / ("in.jsonl.gz" if gzipped else "in.jsonl")
    source.write_bytes(gzip.compress(data) if gzipped else data)
    with pytest.raises(ValueError, match=re.escape(f"{source}:4: longer than 1 MiB")):
        shard([str(source)], str(tmp_path / "out"), 2)
    summary = shard([str(source)], str(tmp_path / "out"), 2, skip_invalid=True)
    assert (summary.records, summary.skipped) == (6, 1)
    assert summary.skipped_examples == [f"{source}:4: longer than 1 MiB: not a line of text "
                                        "(one record a line)"]  # fmt: skip
    assert sorted(
        t[:-1].astype(np.uint8).tobytes().decode()
        for docs in documents(tmp_path / "out").values()
        for t in docs
    ) == sorted(TEXTS[:3] * 2)


def test_refusals_leave_the_output_alone(tmp_path, pyinit_bin):
    source = write_jsonl(tmp_path / "in.jsonl", TEXTS[:10])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    out = tmp_path / "out"

    def pyinit_shard(*args):
        return run([pyinit_bin, "shard", *args, "--out", out])

    result = pyinit_shard(empty, "--shards", "2")
    assert result.returncode == 2 and f"no records in {empty}" in result.stderr
    result = pyinit_shard(source, "--shards", "11")
    assert result.returncode == 2 and "11 shards for 10 records" in result.stderr
    result = pyinit_shard(tmp_path / "missing.jsonl", "--shards", "2")
    # A file that is not there is a system error (exit 1) naming it, not bad content.
    assert result.returncode == 1
    assert "missing.jsonl: No such file or directory" in result.stderr
    result = pyinit_shard(source, "--shards", "0")
    assert result.returncode == 2 and "must be from 1 to 65536" in result.stderr
    result = pyinit_shard(source, "--shards", "2", "--tokenizer", tmp_path / "nope.json")
    assert result.returncode == 1 and "nope.json: no such tokenizer file" in result.stderr
    assert not out.exists()  # refused before any output, or the folder it made removed

    assert pyinit_shard(source, "--shards", "3").returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    result = pyinit_shard(source, "--shards", "2")
    assert result.returncode == 2, result.stderr
    assert "already holds 3 shards (e.g. shard-00000-of-00003.tok) and shards.json" in result.stderr
    assert "--force" in result.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before

    result = pyinit_shard(source, "--shards", "2", "--force")
    assert result.returncode == 0 and "replaced 3 shard files" in result.stdout
    assert sorted(p.name for p in out.glob("*.tok")) == [shard_name(0, 2), shard_name(1, 2)]


def test_a_failure_midway_leaves_no_shard_that_looks_whole(tmp_path, monkeypatch):
    source = write_jsonl(tmp_path / "in.jsonl", TEXTS * 20)
    real = sharder._write_chunk
    calls = []

    def fail_on_third(*args):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        real(*args)

    monkeypatch.setattr(sharder, "_write_chunk", fail_on_third)
    monkeypatch.setattr(sharder, "CHUNK_RECORDS", 1000)
    with pytest.raises(OSError, match="No space"):
        shard([str(source)], str(tmp_path / "out"), 4)
    assert not (tmp_path / "out").exists()  # the run made it, and it holds nothing


def test_progress_lines_on_long_inputs(tmp_path, monkeypatch):
    source = write_jsonl(tmp_path / "in.jsonl", TEXTS * 20)
    monkeypatch.setattr(sharder, "CHUNK_RECORDS", 1000)
    monkeypatch.setattr(sharder, "PROGRESS_EVERY_S", 0.0)
    stream = io.StringIO()
    shard([str(source)], str(tmp_path / "out"), 2, progress=stream)
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 5 and all(line.startswith("pyinit shard: ") for line in lines)
    assert "%" in lines[-1] and "records" in lines[-1]
    # A short input prints nothing at the normal interval.
    monkeypatch.undo()
    stream = io.StringIO()
    shard([str(source)], str(tmp_path / "out2"), 2, progress=stream)
    assert stream.getvalue() == ""


def test_large_vocabulary_gets_four_byte_tokens(tmp_path):
    from pyinit.data.shard_format import ShardWriter

    writer = ShardWriter(tmp_path / "big.tok", 4, 100_000, None, 0, 1, run_id=7)
    writer.append(np.array([99_999, 70_000, 1], dtype=np.uint32), np.array([3]))
    writer.finish()
    writer.publish()
    header = read_header(tmp_path / "big.tok")
    assert header.dtype == np.dtype("<u4") and header.eot is None
    assert os.path.getsize(tmp_path / "big.tok") == header.file_size
    assert np.fromfile(tmp_path / "big.tok", "<u4", 3, offset=HEADER_BYTES).tolist() == [
        99_999,
        70_000,
        1,
    ]


def test_progress_on_gzip_input_counts_compressed_bytes(tmp_path, monkeypatch):

    source = tmp_path / "in.jsonl.gz"
    with gzip.open(source, "wt") as f:
        for i in range(20000):
            f.write(json.dumps({"text": f"record {i} " * 8}) + "\n")
    monkeypatch.setattr(sharder, "CHUNK_RECORDS", 1000)
    monkeypatch.setattr(sharder, "PROGRESS_EVERY_S", 0.0)
    stream = io.StringIO()
    summary = shard([str(source)], str(tmp_path / "out"), 2, progress=stream)
    percents = [int(share) for share in re.findall(r"\((\d+)%\)", stream.getvalue())]
    assert percents and max(percents) <= 100.0
    assert summary.input_bytes == source.stat().st_size  # the file's bytes, not the text's
