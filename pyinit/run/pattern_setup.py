"""Inductor's pattern matcher set up while a worker waits for its GPU, not
inside its first compile, where the same command on this node compiled for
that GPU before.

A compile that AOTAutograd's cache passes over (a graph torch will not
cache, traced at every start: with ``PYINIT_DDP_AOT_CACHE=off``, DDP's pieces
of a compiled model, ``pyinit.run.ddp_pieces``) traces
inductor's replacement patterns first, once per process (``lazy_init`` of
``joint_graph`` and ``post_grad``: padded matmuls, attention, index
patterns), with fake tensors on the graph's device: 0.3-0.4 s of a compiled
worker's first step on an H200 host. It cannot be done before the fork: a
fake CUDA tensor initialises CUDA (torch makes a real one first), and a CUDA
context does not survive a fork. So a worker whose command's last start here
went past the cache on a GPU (``pyinit.run.compile_notes``: a restart from
the same agent, the next launch from the same warm interpreter) does it in a
thread, for that GPU, from CUDA's initialisation on: it runs while the main
thread waits, GIL released, for NCCL's set-up, the device and its peers.
torch keeps the patterns per process and device (a cache on ``lazy_init``'s
argument), so the compile finds them. A CPU job has no such wait to fill: on
the 2-core VM the thread only took the CPU from the main thread (a restart
2.74-3.00 s with it, 2.57-2.78 s without), so the CPU's patterns stay inside
the compile.

The thread never runs beside a compile or a fork: the first module call,
the first compile and every ``os.fork`` wait for it first. Tracing the
patterns changes state that torch's tracing of the script shares (its
counters, FX's node-metadata switch), and a fork would copy whatever lock
the thread held.
"""

from __future__ import annotations

import inspect
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from pyinit.runlog.events import boottime

PHASE = "compile: pattern set-up"
# What the set-up runs, imported already (the compile set, pyinit.run.preload)
# or it does not start: a module that this thread and the script's imported at
# once, each halfway, would reach the other's half-made module.
NEEDS = ("torch._inductor.fx_passes.joint_graph", "torch._inductor.fx_passes.post_grad")


def optimizer_device(optimizer: Any) -> str | None:
    """The one device that `optimizer`'s parameters live on (the compiled
    graph's, whose inputs they are); None when they are spread over several."""
    devices = {str(p.device) for group in optimizer.param_groups for p in group["params"]}
    return devices.pop() if len(devices) == 1 else None


def imported(name: str) -> bool:
    """Whether `name` is imported and done importing."""
    module = sys.modules.get(name)
    return module is not None and not getattr(module.__spec__, "_initializing", False)


def setups_done() -> int | None:
    """How many times this process has set up the joint-graph patterns (one
    per device), where torch's cache says; None before inductor is imported."""
    joint_graph = sys.modules.get("torch._inductor.fx_passes.joint_graph")
    info = getattr(getattr(joint_graph, "lazy_init", None), "cache_info", None)
    return info().misses if info is not None else None


class PatternSetup:
    """The thread that sets up the patterns for `device` ("cpu", "cuda:1"),
    and its phase, written through `log_phase(name, start, end, **fields)`
    at the first wait."""

    def __init__(self, device: str, log_phase: Callable[..., None]):
        self.device = device
        self.log_phase = log_phase
        self.thread: threading.Thread | None = None
        self.span = (0.0, 0.0)
        self.error = ""
        self.closed = False  # waited for: a compile or a module call may have begun

    def start(self) -> None:
        if self.thread is None and not self.closed and all(imported(n) for n in NEEDS):
            self.thread = threading.Thread(target=self._set_up, name="pyinit-patterns",
                                           daemon=True)  # fmt: skip
            os.register_at_fork(before=self._join)
            self.thread.start()

    def wait(self) -> None:
        """Returns once the set-up is done, and logs it; one never started
        never starts after this."""
        first = not self.closed
        self.closed = True
        self._join()
        if first and self.thread is not None:
            fields = {"device": self.device, "beside": True}
            if self.error:
                fields["error"] = self.error
            self.log_phase(PHASE, *self.span, **fields)

    def _join(self) -> None:
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join()

    def _set_up(self) -> None:
        began = boottime()
        try:
            import torch
            from torch._inductor.fx_passes import joint_graph, post_grad

            device = torch.device(self.device)
            if device.type == "cuda":
                if device.index is None or device.index >= torch.cuda.device_count():
                    raise ValueError(f"no device {self.device} here")
                # What the compile's thread has made current (the script's
                # set_device), where a device without an index resolves to it.
                torch.cuda.set_device(device)
            if "input_device" in inspect.signature(joint_graph.lazy_init).parameters:
                joint_graph.lazy_init(device)  # as joint_graph_passes calls it: positionally
            else:  # a torch whose patterns do not depend on the device
                joint_graph.lazy_init()
            post_grad.lazy_init()
        except Exception as error:  # the compile sets the patterns up itself, as without us
            self.error = f"{type(error).__name__}: {error!s:.200}"
        self.span = (began, boottime())
