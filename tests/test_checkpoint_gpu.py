"""pyinit.checkpoint on CUDA: every dtype saved from and loaded onto the
GPU (foreground, background, device maps over the GPUs and the CPU, a
folder), and DCP's storage with CUDA state dicts."""

from __future__ import annotations

import gc
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is installed by the test command")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU here", allow_module_level=True)

from test_checkpoint import bit_equal, every_dtype, write_pretrained  # noqa: E402

from pyinit import checkpoint  # noqa: E402
from pyinit.checkpoint import staging  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]


def on(tensors: dict, device: str) -> dict:
    return {name: t.to(device) for name, t in tensors.items()}


def test_every_dtype_from_and_to_the_gpu_bit_exact(folder):
    host = every_dtype()
    path = folder / "gpu.safetensors"
    checkpoint.save(on(host, "cuda:0"), path)
    back = checkpoint.load(path, device="cuda:0")
    assert all(t.device == torch.device("cuda:0") for t in back.values())
    assert bit_equal(host, on(back, "cpu"))
    assert bit_equal(host, checkpoint.load(path))  # and to the CPU
    on_gpu = on(host, "cuda:0")
    # The stream busy for about half a second: the save returns with its
    # copies still queued, and a change queued after it lands after them.
    torch.cuda._sleep(1_000_000_000)
    pending = checkpoint.save(on_gpu, path, background=True)
    assert not torch.cuda.current_stream().query(), "the background save waited for its copies"
    on_gpu["big"].add_(1)  # after the snapshot: not in the file
    pending.wait(timeout=120)
    assert bit_equal(host, on(checkpoint.load(path, device=torch.device("cuda", 0)), "cpu"))


def test_a_device_map_places_each_tensor_on_its_gpu_or_the_cpu(folder):
    host = every_dtype()
    path = folder / "map.safetensors"
    checkpoint.save(host, path)
    choices = [*(f"cuda:{i}" for i in range(torch.cuda.device_count())), "cpu"]
    places = {name: choices[i % len(choices)] for i, name in enumerate(sorted(host))}
    back = checkpoint.load(path, device=places)
    assert {name: str(t.device) for name, t in back.items()} == places
    assert bit_equal(host, on(back, "cpu"))
    some = checkpoint.load(path, device="cuda:0", keys=["big", "scalar"])
    assert bit_equal({k: host[k] for k in ("big", "scalar")}, on(some, "cpu"))


def test_a_pretrained_folder_loads_onto_the_gpu(folder):
    pytest.importorskip("safetensors.torch", reason="the test extra installs it")
    host = every_dtype()
    write_pretrained(folder, host)
    assert bit_equal(host, on(checkpoint.load(folder, device="cuda:0"), "cpu"))


def test_dcp_saves_and_loads_cuda_state_both_ways(folder):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

    from pyinit.checkpoint import DirectStorageReader, DirectStorageWriter

    state = {"model": on(every_dtype(), "cuda:0"), "step": 11}
    for writer, reader in ((DirectStorageWriter, FileSystemReader),
                           (FileSystemWriter, DirectStorageReader),
                           (DirectStorageWriter, DirectStorageReader)):  # fmt: skip
        path = folder / f"{writer.__name__}-{reader.__name__}"
        dcp.save(state, storage_writer=writer(path))
        into = {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()},
                "step": 0}  # fmt: skip
        dcp.load(into, storage_reader=reader(path))
        assert into["step"] == 11
        assert bit_equal(on(state["model"], "cpu"), on(into["model"], "cpu")), path.name


def mapped(address: int) -> bool:
    for line in Path("/proc/self/maps").read_text().splitlines():
        begin, end = (int(x, 16) for x in line.split()[0].split("-"))
        if begin <= address < end:
            return True
    return False


def test_a_snapshot_s_memory_is_pinned_then_unlocked_and_unmapped_when_freed():
    arena = staging.registered_empty((5 << 20) + 3)
    assert arena.numel() == (5 << 20) + 3 and arena.is_pinned() and arena.data_ptr() % 4096 == 0
    source = torch.arange(1 << 20, dtype=torch.float32, device="cuda:0")
    arena[: 4 << 20].view(torch.float32).copy_(source, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(arena[: 4 << 20].view(torch.float32), source.cpu())
    address = arena.data_ptr()
    del arena
    gc.collect()
    assert not mapped(address)
    # CUDA no longer knows the range: unregistering it again fails (in a
    # thread of its own, whose last CUDA error is left there).
    result = []
    thread = threading.Thread(
        target=lambda: result.append(int(torch.cuda.cudart().cudaHostUnregister(address)))
    )
    thread.start()
    thread.join()
    assert result and result[0] != 0, result


class Interrupting(torch.Tensor):
    """A tensor whose snapshot copy is interrupted, as a Ctrl-C would."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.detach:
            raise KeyboardInterrupt
        return super().__torch_function__(func, types, args, kwargs or {})


def test_an_interrupted_snapshot_waits_for_its_copies_and_keeps_its_memory(folder):
    staging.snapshots._spare.clear()
    first = torch.arange(64 << 20, dtype=torch.float32, device="cuda:0")  # copied first: fp32
    late = torch.zeros(16, dtype=torch.bfloat16, device="cuda:0").as_subclass(Interrupting)
    expected = first.cpu()
    torch.cuda._sleep(1_000_000_000)  # the copy waits behind half a second of the stream's work
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save({"first": first, "late": late}, folder / "x.safetensors", background=True)
    arena = staging.snapshots._spare[True]  # back in the pool, not freed under the copy
    assert torch.equal(arena[: first.numel() * 4].view(torch.float32), expected)
    assert not (folder / "x.safetensors").exists()
