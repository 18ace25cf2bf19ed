"""What is imported before a fork, so the forked processes do not import it.

A training step imports much of torch lazily: the first
``DistributedDataParallel``, FSDP or optimizer step reaches ``torch._dynamo``
(with sympy, ``torch.fx`` and ``torch._inductor``; about 800 modules, 1.9 s on
a 2-core VM, 3.9 s on an H200 host) through functions wrapped in
``torch._disable_dynamo``. Imported once in torchrun's agent (or a warm
interpreter, ``pyinit.run.warm``), every worker it forks, restarted groups
included, finds them loaded.

The fork-safety rule, checked after the preloads by :func:`fork_unsafe`: the
parent of the fork never initialises CUDA, opens a process group or keeps a
thread running. A CUDA context does not survive a fork, and a thread that
holds a lock at the fork leaves that lock held forever in the child.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import importlib
import importlib.machinery
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from pyinit.errors import InputError

# Measured (tests/test_warm.py checks it): after these, the first DDP
# construction, forward, backward and AdamW step import no module of note.
DEFAULT_PRELOADS = ("torch", "torch._dynamo")
# What a compiled first step (torch.compile) imports besides: inductor with
# networkx and the rest of its compiler, dynamo's backends, export's tracer
# (about 760 modules; 0.8-1.6 s and 53 MiB on a 2-core VM). A warm interpreter
# imports them, paid once per node; a cold agent does not, as an eager
# script would pay for them at every launch (tests/test_warm.py checks the set).
COMPILE_PRELOADS = (
    "torch._inductor.compile_fx", "torch._dynamo.backends.inductor",
    "torch._dynamo.backends.distributed", "torch._dynamo.backends.cudagraphs",
    "torch._dynamo.repro.after_dynamo", "torch.export._trace",
    "torch.fx.experimental.validator", "torch._inductor.compiler_bisector",
    "torch._inductor.choices", "torch._inductor.bounds", "torch._inductor.fx_passes.fuse_attention",
    "torch._inductor.fx_passes.pad_mm", "torch._inductor.codegen.cuda_combined_scheduling",
    "torch._inductor.codegen.memory_planning", "torch._inductor.runtime.caching",
    "torch.distributed.tensor.experimental", "torch.utils.cpp_extension",
    # sympy's own lazy imports, met by inductor's printing of index expressions.
    "sympy.tensor.tensor", "sympy.physics.units",
)  # fmt: skip
# The same set as a warm interpreter that a run started imports it, one step
# between launches (a launch that comes meanwhile waits for the step under way):
# compile_fx's own imports first, in parts. On the 2-core VM, compile_fx whole
# took 0.97 s; in these steps the longest is select_algorithm's, 0.30-0.36 s.
COMPILE_PRELOAD_STEPS = (
    "networkx", "jinja2", "torch._functorch.partitioners", "torch._inductor.ir",
    "torch._inductor.codegen.triton", "torch._inductor.select_algorithm", *COMPILE_PRELOADS,
)  # fmt: skip


def import_compile_set() -> None:
    """COMPILE_PRELOADS imported, then what a first compiled step computes
    once per process (compute_compile_caches). PreloadError as import_all."""
    import_all(COMPILE_PRELOADS)
    compute_compile_caches()


def compute_compile_caches(probe_cpu: bool = True) -> None:
    """What the first compiled step of every process computes for itself,
    computed here once, so that every process forked from here has it:
    inductor's hash of torch's own source files (``torch_key``, part of
    every cache key: 0.15-0.2 s on the 2-core VM), triton's hash of its
    compiler and library (``triton_key``, in every cache key where triton is
    installed: 0.3-0.5 s of a compiled worker's first step on an H200 host;
    with it, the one triton module that step imports only after asking the GPU)
    and the check of which vector instructions the CPU's C++ kernels may use
    (``valid_vec_isa_list``: it builds and loads a probe program for each, in
    subprocesses, 1.2-1.8 s on the VM). None of them initialises CUDA or
    leaves a thread. Where one fails (no C++ compiler, another torch), each
    compiling process computes it itself. Without `probe_cpu`, the probe is
    left to the compiling processes: its subprocesses would hold up a launch
    that came meanwhile. A torch built for GPUs never probes here: its
    compiled steps run on the GPU, and on an H200 host the probe's three
    fresh interpreters took 15-40 s, which a restart waited for."""

    with contextlib.suppress(Exception):
        from torch._inductor import codecache

        codecache.torch_key()
    with contextlib.suppress(Exception):
        from torch._inductor.runtime.triton_compat import HAS_TRITON, triton_key

        if HAS_TRITON:
            triton_key()
            # What a first compiled step imports on a GPU with TMA (an H200), once
            # torch.utils._triton has asked the device, which cannot be asked here.
            importlib.import_module("triton.tools.tensor_descriptor")
    if not probe_cpu or not compiles_for_cpu():
        return
    with contextlib.suppress(Exception):
        from torch._inductor import cpu_vec_isa

        cpu_vec_isa.valid_vec_isa_list()


def compiles_for_cpu() -> bool:
    """Whether this torch's compiled steps run on the CPU (a build without
    CUDA or ROCm), and so need inductor's CPU vector-ISA probe."""
    import torch

    return not (torch.version.cuda or getattr(torch.version, "hip", None))


def _check_key(isa: Any, code: str) -> str:
    """One of the probe's checks: the ISA, the compiler flags it builds with
    (AVX-512's bf16 check adds one) and the program it builds."""
    return f"{isa}|{isa.build_arch_flags()}|{hashlib.sha256(code.encode()).hexdigest()[:16]}"


@contextlib.contextmanager
def _checks_answered_by(answer: Callable[[Any, str, Callable[[Any, str], bool]], bool],
                        ) -> Iterator[None]:  # fmt: skip
    """Inductor's ``VecISA.check_build`` (build a small program with an ISA's
    flags, then load it in a fresh interpreter) answered by `answer(isa,
    code, check_build)` while the block runs."""
    from torch._inductor import cpu_vec_isa

    check_build = cpu_vec_isa.VecISA.check_build
    cpu_vec_isa.VecISA.check_build = lambda isa, code: answer(isa, code, check_build)
    try:
        yield
    finally:
        cpu_vec_isa.VecISA.check_build = check_build


def probe_cpu_isa() -> dict[str, bool]:
    """Inductor's CPU vector-ISA probe (``valid_vec_isa_list``) run here, as a
    compiled step would run it; returns each check's verdict by
    :func:`_check_key`, for :func:`prime_cpu_isa` in another process."""
    from torch._inductor import cpu_vec_isa

    verdicts: dict[str, bool] = {}

    def checked(isa: Any, code: str, check_build: Callable[[Any, str], bool]) -> bool:
        verdicts[_check_key(isa, code)] = ok = bool(check_build(isa, code))
        return ok

    with _checks_answered_by(checked):
        cpu_vec_isa.valid_vec_isa_list()
    return verdicts


def prime_cpu_isa(verdicts: Mapping[str, bool]) -> None:
    """This process's probe results (``valid_vec_isa_list`` and each ISA's own
    cached answer) filled from `verdicts`, which :func:`probe_cpu_isa` found
    in a forked copy of this process (the same torch, compiler and CPU), so
    that nothing is built or loaded here. A check not among them runs as
    torch runs it."""
    from torch._inductor import cpu_vec_isa

    def recorded(isa: Any, code: str, check_build: Callable[[Any, str], bool]) -> bool:
        verdict = verdicts.get(_check_key(isa, code))
        return check_build(isa, code) if verdict is None else bool(verdict)

    with _checks_answered_by(recorded):
        cpu_vec_isa.valid_vec_isa_list()


def parse(text: str) -> tuple[str, ...]:
    """--preload's MOD[,MOD...]: the names, checked for shape."""
    names = tuple(word.strip() for word in text.split(",") if word.strip())
    for name in names:
        if not all(part.isidentifier() for part in name.split(".")):
            raise InputError(f"--preload {name!r}: not a module name")
    return names


def check_exists(names: Iterable[str], search: Sequence[str] | None = None) -> None:
    """InputError naming the first module that cannot be found, without
    importing anything (a package's own ``__path__`` is followed as found on
    disk)."""
    for name in names:
        parts = name.split(".")
        spec = importlib.machinery.PathFinder.find_spec(parts[0], list(search or sys.path))
        if spec is None and parts[0] in sys.builtin_module_names:
            continue
        for depth in range(1, len(parts)):
            if spec is None or not spec.submodule_search_locations:
                spec = None
                break
            spec = importlib.machinery.PathFinder.find_spec(
                ".".join(parts[: depth + 1]), list(spec.submodule_search_locations)
            )
        if spec is None:
            raise InputError(f"--preload {name}: no module named {name!r}")


class PreloadError(Exception):
    """A preload whose import raised: the module and the error, one line."""

    def __init__(self, module: str, error: BaseException):
        super().__init__(f"--preload {module}: {type(error).__name__}: {error}")
        self.module = module


def import_all(names: Iterable[str]) -> list[str]:
    """Imports each module; returns those newly imported. PreloadError for
    the first one whose import raises."""
    done = []
    for name in names:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except Exception as error:
            raise PreloadError(name, error) from None
        done.append(name)
    return done


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic collector off while modules are imported, and every
    object made so far frozen out of its reach afterwards.

    torch and ``torch._dynamo`` make some 460,000 objects that live as long
    as the process, nearly none of them garbage (a collection after them
    frees under 9,000): the collector's passes over them were a fifth of the
    imports' time (2.02 s against 1.60, median of 5 on the 2-core VM).
    Frozen (``gc.freeze``), they are skipped by every later collection here
    and in the workers forked from here, whose pages the collector then
    leaves shared."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def threads_as_asked(environ: Mapping[str, str] = os.environ) -> None:
    """torch's intra-op thread count cut to what `environ` asks for, in a
    process forked after ``import torch``.

    OpenMP and MKL read ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` once, as
    torch loads them: a forked worker keeps its parent's count whatever its
    own environment says. torchrun sets ``OMP_NUM_THREADS=1`` for the workers
    of a node that runs several, after its agent (their parent) imported
    torch, so forked workers ran with one thread per core each: on a 2-core
    machine two gloo workers took 0.70 s to their first step against 0.14 s in
    torchrun's fresh ones, and twice as long a step after it. The count is
    only ever lowered: the parent's is what its own environment gave, and a
    warm interpreter serves only launches whose thread settings are its own
    (pyinit.run.warm), so the one setting a worker's environment can add is
    torchrun's. MKL's own variable comes first where torch uses MKL, as in a
    fresh process; a value torch would not take (not a positive integer)
    leaves the count as it is."""
    import torch

    names = ["OMP_NUM_THREADS"]
    if torch.backends.mkl.is_available():
        names.insert(0, "MKL_NUM_THREADS")
    value = next((environ[name] for name in names if name in environ), None)
    if value is None or not (value.strip().isascii() and value.strip().isdigit()):
        return
    asked = int(value)
    if 0 < asked < torch.get_num_threads():
        torch.set_num_threads(asked)


def fork_unsafe() -> str:
    """Why forking now would break the rule above, or "" when it is safe."""
    import threading

    others = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if others:
        return f"a thread is running ({', '.join(others)}); forked workers could deadlock"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialised; forked workers cannot use it"
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return "a process group is open; forked workers would share its connections"
    return ""
