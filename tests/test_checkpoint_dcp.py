"""pyinit.checkpoint's storage for torch.distributed.checkpoint (DCP): our
writer beside DCP's reader and the reverse, plain, DDP and FSDP2 state dicts
on two gloo ranks, resharding on load, async saves, per-item CRCs, and saves
killed at any point (one process, and one rank of two)."""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from netns import free_port

torch = pytest.importorskip("torch", reason="torch is installed by the test command")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter  # noqa: E402

from pyinit.checkpoint import DirectStorageReader, DirectStorageWriter  # noqa: E402
from pyinit.errors import InputError  # noqa: E402
from pyinit.io import ChecksumMismatch  # noqa: E402

# DCP says so once per call outside a process group: what these tests mean.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def state(step: int = 3) -> dict:
    generator = torch.Generator().manual_seed(step)
    return {
        "model": {"w": torch.randn(300, 70, generator=generator),
                  "b": torch.randn(70, generator=generator).to(torch.bfloat16),
                  "t": torch.randn(20, 30, generator=generator).t()},  # not contiguous
        "scalar": torch.tensor(step, dtype=torch.int64),
        "empty": torch.empty(0, 4),
        "extra": {"step": step, "name": "run-7"},  # not a tensor: DCP pickles it
    }  # fmt: skip


def blank() -> dict:
    return {
        "model": {"w": torch.zeros(300, 70), "b": torch.zeros(70, dtype=torch.bfloat16),
                  "t": torch.zeros(30, 20)},
        "scalar": torch.tensor(0, dtype=torch.int64),
        "empty": torch.empty(0, 4),
        "extra": {"step": 0, "name": ""},
    }  # fmt: skip


def same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return a == b


def test_our_writer_and_dcps_reader_and_the_reverse(folder):
    ours, theirs = folder / "ours", folder / "theirs"
    dcp.save(state(), storage_writer=DirectStorageWriter(ours))
    assert sorted(os.listdir(ours)) == [".metadata", "__0_0.distcp"]
    assert sorted(os.listdir(folder)) == ["ours"]  # the staging folder became it
    for reader in (DirectStorageReader(ours), FileSystemReader(ours)):
        loaded = blank()
        dcp.load(loaded, storage_reader=reader)
        assert same(loaded, state()), type(reader).__name__
    dcp.save(state(), storage_writer=FileSystemWriter(theirs))
    loaded = blank()
    dcp.load(loaded, storage_reader=DirectStorageReader(theirs))  # no CRCs there: read unchecked
    assert same(loaded, state())
    # checkpoint_id instead of a path, as DCP's own examples pass it.
    dcp.save(state(5), checkpoint_id=folder / "by-id", storage_writer=DirectStorageWriter())
    loaded = blank()
    dcp.load(loaded, checkpoint_id=folder / "by-id", storage_reader=DirectStorageReader())
    assert same(loaded, state(5))


def test_a_save_over_a_checkpoint_replaces_it_whole_and_async_saves_work(folder):
    path = folder / "ckpt"
    dcp.save(state(1), storage_writer=DirectStorageWriter(path))
    dcp.save(state(2), storage_writer=DirectStorageWriter(path))
    assert sorted(os.listdir(folder)) == ["ckpt"]  # the previous version went
    dcp.async_save(state(4), storage_writer=DirectStorageWriter(path)).result(timeout=120)
    loaded = blank()
    dcp.load(loaded, storage_reader=DirectStorageReader(path))
    assert same(loaded, state(4))
    # A folder of other files is not a checkpoint to swap out: refused, left as it was.
    mine = folder / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    error = save_failure(mine)
    assert isinstance(error, InputError) and "holds files and no .metadata" in str(error)
    assert os.listdir(mine) == ["notes.txt"] and not (folder / ".mine.saving").exists()
    (folder / "a-file").write_text("x")
    assert "not a folder" in str(save_failure(folder / "a-file"))


def save_failure(path: Path) -> BaseException:
    """What our writer raised inside dcp.save (wrapped as dcp.load wraps it)."""
    from torch.distributed.checkpoint.api import CheckpointException

    with pytest.raises(CheckpointException) as raised:
        dcp.save(state(), storage_writer=DirectStorageWriter(path))
    ((exc, _trace),) = raised.value.failures.values()
    return exc


def test_a_damaged_item_is_named_and_a_missing_checkpoint_is_one_line(folder):
    path = folder / "ckpt"
    dcp.save(state(), storage_writer=DirectStorageWriter(path))
    metadata = pickle.loads((path / ".metadata").read_bytes())
    where = next(info for index, info in metadata.storage_data.items()
                 if getattr(index, "fqn", None) == "model.w")  # fmt: skip
    data = path / where.relative_path
    with open(data, "r+b") as f:
        f.seek(where.offset + where.length - 100)  # inside the tensor's bytes
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    error = load_failure(path)
    assert isinstance(error, ChecksumMismatch) and str(data) in str(error)
    assert re.search(r"item 'model\.w' \(bytes .*\): CRC-32C", str(error))
    os.truncate(data, where.offset + 10)
    error = load_failure(path)
    assert isinstance(error, InputError) and str(data) in str(error)
    assert "the file is truncated" in str(error)
    # A folder that is not a checkpoint is our error where the folder is named,
    # by path or by checkpoint_id: inside dcp.load torch would log it with its
    # traceback and raise an AssertionError of its own.
    missing = folder / "nothing" / ".metadata"
    for named in (lambda: DirectStorageReader(missing.parent),
                  lambda: dcp.load(blank(), checkpoint_id=missing.parent,
                                   storage_reader=DirectStorageReader())):  # fmt: skip
        with pytest.raises(FileNotFoundError) as raised:
            named()
        assert raised.value.filename == str(missing)
        assert "no .metadata: not a checkpoint, or one whose save did not finish" in str(
            raised.value)  # fmt: skip
    (path / ".metadata").write_bytes(b"not a pickle")
    with pytest.raises(InputError, match="not DCP metadata") as raised:
        DirectStorageReader(path)
    assert raised.value.file == str(path / ".metadata")


def test_a_reader_named_before_its_checkpoint_was_replaced_reads_the_new_one(folder):
    path = folder / "ckpt"
    dcp.save(state(1), storage_writer=DirectStorageWriter(path))
    reader = DirectStorageReader(path)  # reads the metadata of state(1)
    dcp.save(state(2), storage_writer=DirectStorageWriter(path))  # exchanged into place
    loaded = blank()
    dcp.load(loaded, storage_reader=reader)
    assert same(loaded, state(2))
    loaded = blank()
    dcp.load(loaded, storage_reader=reader)  # a second load through the same reader
    assert same(loaded, state(2))


class RunsCode:
    """A pickle that runs a command as it is loaded."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_metadata_pickle_that_would_run_code_is_refused_unrun(folder):
    path = folder / "ckpt"
    dcp.save(state(), storage_writer=DirectStorageWriter(path))
    marker = folder / "ran"
    metadata = pickle.loads((path / ".metadata").read_bytes())
    metadata.planner_data = RunsCode(marker)  # inside a well-formed metadata, too
    for payload in (RunsCode(marker), metadata):
        (path / ".metadata").write_bytes(pickle.dumps(payload))
        with pytest.raises(InputError, match=r"names posix\.system, which DCP's metadata is not "
                           "made of: refused, never run") as raised:  # fmt: skip
            DirectStorageReader(path)
        assert raised.value.file == str(path / ".metadata")
        assert not marker.exists()


def test_an_item_pickle_that_would_run_code_is_refused_unrun(folder):
    """What is not a tensor DCP saves as a pickle, and its planner loads it
    with torch.load(weights_only=False). A checkpoint from anyone (here
    DCP's own writer's, which records no CRCs; a CRC is no signature
    either) ran its code at a load under a state-dict key as common as
    "extra"; it is now checked by torch's weights-only unpickler first."""
    path = folder / "ckpt"
    marker = folder / "ran"
    dcp.save({**state(), "extra": RunsCode(marker)}, storage_writer=FileSystemWriter(path))
    error = load_failure(path)
    assert isinstance(error, InputError), error
    assert error.file == str(path / "__0_0.distcp")
    said = ("item 'extra' is a pickle that names posix.system, which torch's weights-only "
            "loading does not allow: refused, never run (torch.serialization.add_safe_globals "
            "allows a class you trust)")  # fmt: skip
    assert str(error).endswith(said)
    assert not marker.exists()
    # What weights-only loading takes (dicts, numbers, strings) still loads.
    plain = folder / "plain"
    dcp.save(state(), storage_writer=FileSystemWriter(plain))
    loaded = blank()
    dcp.load(loaded, storage_reader=DirectStorageReader(plain))
    assert same(loaded, state())


def rewrite_crcs(path: Path, change) -> None:
    """The checkpoint's metadata with its CRC table changed by `change`."""
    metadata = pickle.loads((path / ".metadata").read_bytes())
    change(metadata.storage_data)
    (path / ".metadata").write_bytes(pickle.dumps(metadata))


def test_crcs_are_recorded_in_the_metadata_and_cannot_be_switched_off(folder):
    path = folder / "ckpt"
    dcp.save(state(), storage_writer=DirectStorageWriter(path))
    storage = pickle.loads((path / ".metadata").read_bytes()).storage_data
    table = storage["pyinit.crc32c"]
    assert len(table) == len(storage) - 1 >= 5  # every item has one
    assert not (path / ".crc32c").exists()  # no file beside it to delete
    # A table that lacks items is damage, not "unchecked".
    rewrite_crcs(path, lambda storage: storage["pyinit.crc32c"].clear())
    error = load_failure(path)
    assert isinstance(error, ChecksumMismatch) and "has no CRC-32C recorded" in str(error)
    # The first version's .crc32c beside the metadata is still checked, and
    # one that lacks items is damage too.
    rewrite_crcs(path, lambda storage: storage.pop("pyinit.crc32c"))
    (path / ".crc32c").write_text(json.dumps(dict(list(table.items())[:1])))
    error = load_failure(path)
    assert isinstance(error, ChecksumMismatch) and "has no CRC-32C recorded" in str(error)
    (path / ".crc32c").write_text(json.dumps(table))
    loaded = blank()
    dcp.load(loaded, storage_reader=DirectStorageReader(path))
    assert same(loaded, state())


def load_failure(path: Path) -> BaseException:
    """What our reader raised inside dcp.load, which wraps it (a
    CheckpointException holding each rank's exception)."""
    from torch.distributed.checkpoint.api import CheckpointException

    with pytest.raises(CheckpointException) as raised:
        dcp.load(blank(), storage_reader=DirectStorageReader(path))
    ((exc, _trace),) = raised.value.failures.values()
    return exc


SAVE_FOREVER = """
import os, sys, warnings
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from pyinit.checkpoint import DirectStorageWriter
warnings.simplefilter("ignore")
path = sys.argv[1]
if "WORLD_SIZE" in os.environ:
    dist.init_process_group("gloo")
rank = int(os.environ.get("RANK", "0"))
state = {"w": torch.zeros(4 << 20), "step": torch.zeros((), dtype=torch.int64)}
for step in range(1, 1000000):
    state["w"].fill_(step)
    state["step"].fill_(step)
    dcp.save(state, storage_writer=DirectStorageWriter(path))
    print(step, flush=True)
"""


def ranks(script: str, world: int, *args: str) -> list[subprocess.Popen]:
    port = free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
               "OMP_NUM_THREADS": "1"}  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, "-c", script, *args], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))  # fmt: skip
    return procs


def check_the_last_whole_save(folder: Path, path: Path) -> None:
    loaded = {"w": torch.empty(4 << 20), "step": torch.zeros((), dtype=torch.int64)}
    dcp.load(loaded, storage_reader=DirectStorageReader(path))  # checks every item's CRC
    step = int(loaded["step"])
    assert step >= 1 and bool((loaded["w"] == step).all())
    # Nothing under the checkpoint's name but whole checkpoints; a killed
    # save's staging folder, if any, is hidden and goes with the next save.
    assert [n for n in os.listdir(folder) if not n.startswith(".")] == [path.name]


FAILING_SAVE = """
import sys, warnings
import torch
import torch.distributed.checkpoint as dcp
from pyinit.checkpoint import DirectStorageWriter
warnings.simplefilter("ignore")

class Unsaveable:
    def __reduce__(self):
        raise RuntimeError("cannot be saved")

dcp.save({"w": torch.ones(1000), "bad": Unsaveable()},
         storage_writer=DirectStorageWriter(sys.argv[1]))
"""

SAVE_UNDER_WAY = """
import sys, time
from torch.distributed.checkpoint.planner import SavePlan
from pyinit.checkpoint import DirectStorageWriter
writer = DirectStorageWriter(sys.argv[1])
writer.reset()
writer.prepare_global_plan([SavePlan([])])  # planned: the ranks would write now
print("writing", flush=True)
time.sleep(600)
"""


def test_a_later_save_removes_abandoned_saves_folders_but_not_one_under_way(
        folder, monkeypatch):  # fmt: skip
    """A save that failed left its `.NAME.saving` folder, with what the
    ranks had written, until the next save of the same path; saved to a
    new folder each time (step-200 after step-100), it was never removed,
    and on a full disk it failed the next save too. A save removes the
    staging folders beside it that no save holds and that are a minute old."""
    from pyinit.checkpoint import dcp as ours

    users = folder / ".notes.saving"  # a name like ours, and a user's files in it
    users.mkdir()
    (users / "todo.txt").write_text("keep")
    odd = folder / ".odd.saving" / "__0_0.distcp"  # a rank file's name, but a folder
    odd.mkdir(parents=True)
    (odd / "todo.txt").write_text("keep")
    failed = subprocess.run([sys.executable, "-c", FAILING_SAVE, str(folder / "step-1")],
                            capture_output=True, text=True)  # fmt: skip
    assert failed.returncode == 1 and "cannot be saved" in failed.stderr
    assert (folder / ".step-1.saving").is_dir()
    under_way = subprocess.Popen([sys.executable, "-c", SAVE_UNDER_WAY, str(folder / "step-2")],
                                 stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert under_way.stdout.readline() == "writing\n"
        dcp.save(state(), storage_writer=DirectStorageWriter(folder / "step-3"))
        # A minute old at least: a save creates its folder just before it locks it.
        assert (folder / ".step-1.saving").is_dir()
        monkeypatch.setattr(ours, "SWEEP_AFTER_S", 0.0)
        dcp.save(state(), storage_writer=DirectStorageWriter(folder / "step-4"))
        assert not (folder / ".step-1.saving").exists()
        assert (folder / ".step-2.saving").is_dir()  # held by the save under way
    finally:
        under_way.kill()
        under_way.wait()
        under_way.stdout.close()
    dcp.save(state(), storage_writer=DirectStorageWriter(folder / "step-5"))
    assert sorted(os.listdir(folder)) == [".notes.saving", ".odd.saving", "step-3", "step-4",
                                          "step-5"]  # fmt: skip
    assert (users / "todo.txt").read_text() == (odd / "todo.txt").read_text() == "keep"
    loaded = blank()
    dcp.load(loaded, storage_reader=DirectStorageReader(folder / "step-5"))
    assert same(loaded, state())


FULL_DISK_TWO_RANKS = """
import os, sys, warnings
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from pyinit.checkpoint import DirectStorageWriter, dcp as ours
warnings.simplefilter("ignore")
ours.SWEEP_AFTER_S = 0.0  # the next save comes at once here, not minutes later
out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
# MiB of float32: rank 0's cannot fit the disk; rank 1's is written.
first = torch.ones((16 if rank == 0 else 7) << 18)
try:
    dcp.save({f"w{rank}": first}, storage_writer=DirectStorageWriter(f"{out}/step-1"))
except CheckpointException as failed:
    print("failed", "No space left on device" in str(failed), flush=True)
dist.barrier()
print("left", sorted(os.listdir(out)), flush=True)
dist.barrier()
second = torch.full((4 << 18,), float(rank))  # 8 MiB in all: room only without what is left
dcp.save({f"v{rank}": second}, storage_writer=DirectStorageWriter(f"{out}/step-2"))
print("saved", sorted(os.listdir(out)), flush=True)
dist.destroy_process_group()
"""


@pytest.mark.root
@pytest.mark.slow
def test_a_save_that_filled_the_disk_does_not_fail_the_next_one(tmp_path):
    """Two ranks: rank 0's file cannot fit, rank 1's is written into the
    staging folder. The next save, to a new folder, had room only once that
    folder was gone, and failed for lack of space too."""
    from conftest import loop_filesystem

    with loop_filesystem(tmp_path, 16) as mount:
        procs = ranks(FULL_DISK_TWO_RANKS, 2, str(mount))
        outs = []
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err[-3000:]
            outs.append(out.splitlines())
        for lines in outs:
            assert lines == ["failed True", "left ['.step-1.saving', 'lost+found']",
                             "saved ['lost+found', 'step-2']"]  # fmt: skip
        loaded = {"v0": torch.zeros(4 << 18), "v1": torch.zeros(4 << 18)}
        dcp.load(loaded, storage_reader=DirectStorageReader(mount / "step-2"))
        assert bool((loaded["v0"] == 0).all()) and bool((loaded["v1"] == 1).all())


def test_a_dcp_save_killed_at_any_point_leaves_the_previous_checkpoint(folder):
    path = folder / "ckpt"
    for attempt in range(2):
        child = subprocess.Popen([sys.executable, "-c", SAVE_FOREVER, str(path)],
                                 stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert child.stdout.readline().strip().isdigit(), attempt
        time.sleep(random.uniform(0.0, 0.3))
        child.kill()
        child.wait()
        child.stdout.close()
        check_the_last_whole_save(folder, path)


@pytest.mark.slow
def test_one_rank_of_two_killed_mid_save_leaves_the_previous_checkpoint(folder):
    path = folder / "ckpt"
    procs = ranks(SAVE_FOREVER, 2, str(path))
    try:
        assert procs[0].stdout.readline().strip().isdigit(), procs[0].stderr.read()
        time.sleep(random.uniform(0.0, 0.3))
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait()
        try:  # gloo sees its peer gone and the survivor fails; it must not hang forever
            procs[0].wait(timeout=60)
        except subprocess.TimeoutExpired:
            procs[0].kill()
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()
    check_the_last_whole_save(folder, path)


TWO_RANKS = """
import os, sys, warnings
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict import (get_state_dict, set_model_state_dict,
                                                     set_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard, distribute_tensor
from torch.nn.parallel import DistributedDataParallel
from pyinit.checkpoint import DirectStorageReader, DirectStorageWriter
warnings.simplefilter("ignore")
out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2,))

def fsdp_model(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 8))
    for layer in model[::2]:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(100 + rank)
    model(torch.randn(4, 64)).sum().backward()
    optim.step()
    return model, optim

def full(model):
    return [p.full_tensor() for p in model.parameters()]

# FSDP2: sharded model and optimizer state, our writer; our reader and DCP's.
model, optim = fsdp_model(0)
msd, osd = get_state_dict(model, optim)
dcp.save({"model": msd, "optim": osd}, storage_writer=DirectStorageWriter(f"{out}/fsdp"))
for reader in (DirectStorageReader, FileSystemReader):
    other, other_optim = fsdp_model(1)
    msd2, osd2 = get_state_dict(other, other_optim)
    dcp.load({"model": msd2, "optim": osd2}, storage_reader=reader(f"{out}/fsdp"))
    set_state_dict(other, other_optim, model_state_dict=msd2, optim_state_dict=osd2)
    assert all(torch.equal(a, b) for a, b in zip(full(model), full(other))), reader
# DCP's writer, our reader.
dcp.save({"model": msd}, storage_writer=FileSystemWriter(f"{out}/fsdp-theirs"))
other, other_optim = fsdp_model(2)
msd3, _ = get_state_dict(other, other_optim)
dcp.load({"model": msd3}, storage_reader=DirectStorageReader(f"{out}/fsdp-theirs"))
set_model_state_dict(other, msd3)
assert all(torch.equal(a, b) for a, b in zip(full(model), full(other)))

# Resharding: saved split by rows, loaded split by columns.
torch.manual_seed(7)
whole = torch.randn(64, 48)
rows = distribute_tensor(whole, mesh, [Shard(0)])
dcp.save({"x": rows}, storage_writer=DirectStorageWriter(f"{out}/dtensor"))
columns = distribute_tensor(torch.zeros(64, 48), mesh, [Shard(1)])
dcp.load({"x": columns}, storage_reader=DirectStorageReader(f"{out}/dtensor"))
assert torch.equal(columns.full_tensor(), whole)

# DDP: every rank holds the whole model; async, to a path saved before.
torch.manual_seed(3)
ddp = DistributedDataParallel(torch.nn.Linear(32, 16))
dcp.save({"model": ddp.state_dict()}, storage_writer=DirectStorageWriter(f"{out}/ddp"))
with torch.no_grad():
    ddp.module.weight.mul_(2)
dcp.async_save({"model": ddp.state_dict()},
               storage_writer=DirectStorageWriter(f"{out}/ddp")).result(timeout=120)
if rank == 0:
    torch.save({k: v.clone() for k, v in ddp.state_dict().items()}, f"{out}/ddp-expected.pt")
print("ranks agree", rank, flush=True)
dist.destroy_process_group()
# The group outlives destroy_process_group (DTensor's sharding caches keep the
# mesh that holds it), so gloo's threads still run during the interpreter's
# teardown; one freeing its last collective's tensors takes the GIL there,
# which ends the thread inside a destructor and std::terminate aborts the
# rank. Nothing here needs the teardown: the process ends as a forked worker does.
os._exit(0)
"""


@pytest.mark.slow
def test_fsdp2_ddp_and_dtensor_state_on_two_gloo_ranks(folder):
    procs = ranks(TWO_RANKS, 2, str(folder))
    try:
        for rank, proc in enumerate(procs):
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err[-3000:]
            assert f"ranks agree {rank}" in out
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()
    # One process reads what two wrote: DCP reshards the FSDP2 shards to whole tensors.
    expected = torch.load(folder / "ddp-expected.pt")
    loaded = {"model": {k: torch.zeros_like(v) for k, v in expected.items()}}
    dcp.load(loaded, storage_reader=DirectStorageReader(folder / "ddp"))
    assert same(loaded["model"], expected)
    whole = {"x": torch.zeros(64, 48)}
    dcp.load(whole, storage_reader=DirectStorageReader(folder / "dtensor"))
    torch.manual_seed(7)
    assert torch.equal(whole["x"], torch.randn(64, 48))
    names = sorted(os.listdir(folder / "fsdp"))
    assert names == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert not [n for n in os.listdir(folder) if n.endswith(".saving")]
