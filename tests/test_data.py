"""TokenShardDataset against the shard files read plainly: window contents,
disjoint ranks and workers that together make one process's epoch, seeded
order, mid-epoch resume, cold (evicted) and warm reads, and refused shards."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import resident

from pyinit.data import TokenShardDataset
from pyinit.data.shard_format import HEADER_BYTES, ShardWriter, read_header
from pyinit.data.sharder import shard

SEQ = 64


@pytest.fixture(scope="module")
def shards() -> Path:
    # /var/tmp: the root filesystem, which takes O_DIRECT (/tmp may be tmpfs).
    folder = Path("/var/tmp") / f"pyinit-data-{os.getpid()}"
    folder.mkdir()
    rng = np.random.default_rng(3)
    lines = [
        '{"text": "' + "".join(rng.choice(list("abcdefgh ijk"), rng.integers(1, 400))) + '"}'
        for _ in range(3000)
    ]
    (folder / "in.jsonl").write_text("\n".join(lines) + "\n")
    shard([str(folder / "in.jsonl")], str(folder / "out"), 5)
    yield folder / "out"
    shutil.rmtree(folder)


def plain_window(path: str, start: int, length: int) -> np.ndarray:
    header = read_header(path)
    return np.fromfile(path, header.dtype, length, offset=HEADER_BYTES + start * header.token_bytes)


def windows_of(data: TokenShardDataset) -> list[tuple[int, int]]:
    found = []
    for b in range(len(data)):
        shard_of, start = data.windows(b)
        found += zip(shard_of.tolist(), start.tolist(), strict=True)
    return found


def test_batches_hold_the_windows_they_name(shards):
    data = TokenShardDataset(shards, SEQ, rank=0, world_size=1, batch_size=8, seed=5)
    assert data.token_bytes == 2 and len(data.paths) == 5
    for b in (0, 3, len(data) - 1):
        x, y = data.batch(b)
        assert x.dtype == torch.int64 and x.shape[1] == SEQ and torch.equal(x[:, 1:], y[:, :-1])
        for row, (s, start) in enumerate(zip(*data.windows(b), strict=True)):
            window = plain_window(data.paths[s], int(start), SEQ + 1)
            assert np.array_equal(x[row].numpy(), window[:-1])
            assert np.array_equal(y[row].numpy(), window[1:])


def test_an_epoch_is_every_window_once_in_a_seeded_order(shards):
    data = TokenShardDataset(shards, SEQ, rank=0, world_size=1, batch_size=16, seed=1)
    epoch0 = windows_of(data)
    expected = {
        (s, w * SEQ) for s, h in enumerate(data.headers) for w in range((h.token_count - 1) // SEQ)
    }
    assert len(epoch0) == len(expected) == data.window_count and set(epoch0) == expected
    assert windows_of(TokenShardDataset(shards, SEQ, 0, 1, seed=1, batch_size=16)) == epoch0
    assert windows_of(TokenShardDataset(shards, SEQ, 0, 1, seed=2, batch_size=16)) != epoch0
    data.set_epoch(1)
    epoch1 = windows_of(data)
    assert epoch1 != epoch0 and set(epoch1) == expected


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_are_disjoint_and_cover_one_process(shards, world_size):
    one = windows_of(TokenShardDataset(shards, SEQ, 0, 1, batch_size=4))
    ranks = [
        windows_of(TokenShardDataset(shards, SEQ, r, world_size, batch_size=4))
        for r in range(world_size)
    ]
    per_rank = len(one) // world_size
    assert all(len(r) == per_rank for r in ranks)  # every rank takes the same number of steps
    union = [w for r in ranks for w in r]
    assert len(set(union)) == len(union)
    # Together: one process's epoch, less the last len % world_size windows of its order.
    assert set(union) == set(one[: per_rank * world_size])


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_give_exactly_the_one_process_batches(shards, context):
    single = TokenShardDataset(shards, SEQ, 0, 1, batch_size=32, seed=9)
    expected = list(single)
    assert single.epoch == 1 and single.position == 0
    data = TokenShardDataset(shards, SEQ, 0, 1, batch_size=32, seed=9)
    loader = data.loader(num_workers=2, multiprocessing_context=context)
    got = list(loader)
    assert len(got) == len(expected) == len(loader)
    for (x, y), (ex, ey) in zip(got, expected, strict=True):
        assert torch.equal(x, ex) and torch.equal(y, ey)
    assert data.epoch == 1 and data.position == 0


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_iterated_is_its_batches_read_one_by_one(shards, workers):
    # Rank 1 of 3, and a batch size that leaves the last batch short.
    data = TokenShardDataset(shards, SEQ, 1, 3, batch_size=7, seed=2)
    expected = [data.batch(b) for b in range(len(data))]
    assert 0 < len(expected[-1][0]) < 7
    got = list(data.loader(num_workers=workers))
    assert len(got) == len(expected)
    for (x, y), (ex, ey) in zip(got, expected, strict=True):
        assert torch.equal(x, ex) and torch.equal(y, ey)


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch(shards, workers):
    uninterrupted = list(TokenShardDataset(shards, SEQ, 0, 1, batch_size=32, seed=4))
    data = TokenShardDataset(shards, SEQ, 0, 1, batch_size=32, seed=4)
    loader = data.loader(num_workers=workers)
    taken = []
    for batch in loader:
        taken.append(batch)
        if len(taken) == 7:
            break
    state = loader.state_dict()
    assert state["position"] == 7 and state["epoch"] == 0
    resumed = TokenShardDataset(shards, SEQ, 0, 1, batch_size=32, seed=4)
    resumed.load_state_dict(state)
    rest = list(resumed.loader(num_workers=2 - workers))  # another worker count on purpose
    assert len(taken) + len(rest) == len(uninterrupted)
    for (x, _), (ex, _) in zip(taken + rest, uninterrupted, strict=True):
        assert torch.equal(x, ex)
    other = TokenShardDataset(shards, SEQ + 1, 0, 1, batch_size=32, seed=4)
    with pytest.raises(ValueError, match="the state has seq_len 64, this data set 65"):
        other.load_state_dict(state)


def test_warm_rows_come_from_the_page_cache_and_cold_ones_from_the_device(shards):
    # A copy no other test's reader has mapped: mapped pages are not evicted.
    shards = shutil.copytree(shards, shards.with_name("copy"))
    data = TokenShardDataset(shards, SEQ, 0, 1, batch_size=16)
    with resident(*data.paths):
        warm = data.batch(0)
    stats = data.reader_stats()
    assert stats["page_cache_reads"] == 16 and stats["ios"] == 0
    data.close()  # pages mapped by a process stay in the cache
    # Made before the eviction: reading the headers reads ahead into the tokens.
    cold = TokenShardDataset(shards, SEQ, 0, 1, batch_size=16)
    for path in data.paths:
        fd = os.open(path, os.O_RDONLY)
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    x, _ = cold.batch(0)
    assert torch.equal(x, warm[0])
    stats = cold.reader_stats()
    assert stats["page_cache_reads"] == 0 and stats["ios"] >= 16


def corrupt(tmp_path: Path, shards: Path, how: str) -> Path:
    source = sorted(shards.glob("*.tok"))[0]
    target = tmp_path / source.name
    raw = bytearray(source.read_bytes())
    if how == "magic":
        raw[:8] = b"NOTTOKS\0"
    elif how == "truncated":
        raw = raw[: len(raw) - 100]
    elif how == "header":
        raw[16:24] = (read_header(source).token_count + 10).to_bytes(8, "little")
    elif how == "longer":
        raw += b"\0" * 8
    target.write_bytes(bytes(raw))
    return target


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("magic", "bad magic b'NOTTOKS\\x00'"),
        ("truncated", "truncated: "),
        ("header", "index offset"),
        ("longer", "longer than its header says"),
    ],
)
def test_bad_shards_are_refused_with_path_and_reason(tmp_path, shards, how, reason):
    bad = corrupt(tmp_path, shards, how)
    with pytest.raises(ValueError) as refused:
        TokenShardDataset([*sorted(shards.glob("*.tok"))[1:], bad], SEQ, 0, 1)
    assert str(refused.value).startswith(f"{bad}: not a usable token shard: ")
    assert reason in str(refused.value)


def write_shard(path: Path, token_bytes: int, index: int, count: int, run_id: int) -> Path:
    writer = ShardWriter(path, token_bytes, 100_000 if token_bytes == 4 else 300, None, index,
                         count, run_id)  # fmt: skip
    writer.append(np.arange(500, dtype=np.uint32 if token_bytes == 4 else np.uint16),
                  np.array([500]))  # fmt: skip
    writer.finish()
    writer.publish()
    return path


def test_other_refusals(tmp_path, shards):
    wide = write_shard(tmp_path / "wide.tok", 4, 0, 2, run_id=9)
    narrow = write_shard(tmp_path / "narrow.tok", 2, 1, 2, run_id=9)
    with pytest.raises(ValueError, match=r"token_bytes 4 differs from 2 .* different tokenizers"):
        TokenShardDataset([narrow, wide], SEQ, 0, 1)
    alone = write_shard(tmp_path / "alone.tok", 4, 0, 1, run_id=3)
    with pytest.raises(ValueError, match="too few for 1000 ranks"):
        TokenShardDataset(alone, 100, 0, 1000)
    (tmp_path / "nothing").mkdir()
    with pytest.raises(ValueError, match=r"no shards\.json: not a whole set of shards"):
        TokenShardDataset(tmp_path / "nothing", SEQ, 0, 1)
    with pytest.raises(FileNotFoundError):
        TokenShardDataset(tmp_path / "missing.tok", SEQ, 0, 1)
    with pytest.raises(ValueError, match="rank 2 is outside world_size 2"):
        TokenShardDataset(shards, SEQ, 2, 2)
    with pytest.raises(ValueError, match="seq_len must be a positive int"):
        TokenShardDataset(shards, 0, 0, 1)
    # uint32 tokens read back right.
    data = TokenShardDataset(alone, 100, 0, 1, batch_size=2)
    x, y = data.batch(0)
    starts = data.windows(0)[1]
    assert x[0, 0].item() == starts[0] and y[0, -1].item() == starts[0] + 100


def test_rank_and_world_size_come_from_torchrun_env(shards, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    data = TokenShardDataset(shards, SEQ)
    assert (data.rank, data.world_size) == (1, 3)


@pytest.mark.gpu
def test_batches_land_in_pinned_memory_and_reach_the_gpu(shards):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here: pinned memory needs one")
    data = TokenShardDataset(shards, SEQ, 0, 1, batch_size=8)
    x, y = data.batch(0)
    assert x.is_pinned() and y.is_pinned()
    on_gpu = x.cuda(non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(on_gpu.cpu(), x)
    # Through DataLoader workers: the DataLoader pins what the workers made.
    loaded = next(iter(TokenShardDataset(shards, SEQ, 0, 1, batch_size=8).loader(num_workers=1)))
    assert loaded[0].is_pinned() and torch.equal(loaded[0], x)
    plain = TokenShardDataset(shards, SEQ, 0, 1, batch_size=8, pin_memory=False).batch(0)[0]
    assert not plain.is_pinned() and torch.equal(plain, x)


@pytest.mark.root
def test_data_benchmark_runs(tmp_path, pyinit_bin):
    if os.geteuid() != 0:
        pytest.skip("not root: the benchmark's cold runs drop the page cache")
    work = Path("/var/tmp") / f"pyinit-bench-smoke-{os.getpid()}"
    try:
        result = subprocess.run(
            [pyinit_bin, "bench", "data", "--dir", work, "--gib", "64M", "--shards", "4",
             "--batches", "3", "--rounds", "1", "--sharder-mb", "1", "--out", tmp_path],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert result.returncode == 0, result.stderr
    assert "cold" in result.stdout and "warm" in result.stdout
    document = json.loads((tmp_path / "data.json").read_text())
    table = document["loader"]["median_batches_per_s"]
    assert set(table) == {"cold/memmap", "cold/pod-init", "warm/memmap", "warm/pod-init"}
    assert document["loader"]["reader_stats"]["cold"]["page_cache_reads"] == 0
    assert document["loader"]["reader_stats"]["warm"]["ios"] == 0
    assert document["sharder"]["compiled"]["mb_per_s"] > 0
