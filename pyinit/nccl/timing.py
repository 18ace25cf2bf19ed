"""How NCCL's collectives are timed, the same way by the benchmarks and by
``pyinit nccl --tune``: nccl-tests' size steps, CUDA-event timing, and the
environment every timed process gets."""

from __future__ import annotations

from collections.abc import Callable

# NVLink multicast (NVLS) off in every process the timings start: GPUs passed
# through to a VM without multicast support fail or hang NCCL's init with it on.
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def nccl_tests_sizes(smallest: int, largest: int, factor: int, step: int) -> list[int]:
    """The sizes nccl-tests steps through for -b smallest -e largest -f factor -i step."""
    sizes, size = [], smallest
    while size <= largest:
        sizes.append(size)
        size = size * factor if factor > 1 else size + step
    return sizes


def cuda_seconds(call: Callable[[], None], calls: int) -> float:
    """Seconds per call over `calls` back-to-back calls, timed by CUDA events
    on the current stream (what the GPU spent, not what Python waited)."""
    import torch

    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        call()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / 1e3 / calls
