"""AOTAutograd's cache answering for the pieces of a compiled DDP model.

``torch.compile`` around DDP splits the graph at DDP's gradient buckets
(torch's DDPOptimizer) and compiles each piece with ``fakify_first_call``
set: the piece's first call, made with fake tensors to give the next piece
its inputs, returns fake outputs with the strides inductor chose for them.
AOTAutograd's cache refuses such graphs, because a hit has no traced forward
graph to take those outputs from. So every start and every restart traced
each piece again (the metadata pass, the joint graph, its passes and the
partition): 0.77 s of a restarted worker's 1.35 s compile on an H100 node.

What that first call returns follows from the cache key as the compiled code
does: the key covers the graph, its inputs' shapes and strides and the
configuration, and inductor's output strides come from the code the key
finds. So when a piece is compiled, the size, stride, offset, dtype and
device of each output its first call returned go into its cache entry; a
start that finds the entry makes those fake outputs again for the first call
(in the same fake mode, as torch's own wrapper does) and runs the compiled
code after, and hands DDP's optimizer the piece's runtime metadata, as a
compile would have.

Only a piece whose first call can be made again from that record is cached:
outputs of static shape, plain tensors, no tensor subclasses, RNG states or
effect tokens (their wrappers would sit between the record and the compiled
code). A piece with such wrappers, and an entry without a record or with
one in another form (an entry's key does not cover pod-init's version), is
passed over as torch passes it over; one whose outputs cannot be recorded (a
symbolic shape) is not saved, so each start compiles it again, counted as a
miss. ``PYINIT_DDP_AOT_CACHE=off`` leaves torch as it is.
The hooks go in at the script's first compile, where torch has these parts;
another torch is left alone.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

SWITCH = "PYINIT_DDP_AOT_CACHE"  # on (the default) or off; pyinit run refuses anything else
# On a compiled forward, then on its cache entry: the first call's outputs, or UNRECORDABLE.
# An entry whose record is not in Output's form is passed over (readable) at every start,
# since torch finds a key's entries in the same order each time: a record of another form
# would need keys of its own, not only another name here.
RECORD = "_pyinit_first_call_outputs"
UNRECORDABLE = "unrecordable"

Output = tuple[tuple[int, ...], tuple[int, ...], int, str, str, bool]


def switch(environ: Mapping[str, str]) -> str:
    """The switch as `environ` sets it: "on", "off", or what else it says."""
    return (environ.get(SWITCH) or "on").strip().lower()


def record_of(outputs: Sequence[Any]) -> tuple[Output, ...] | str:
    """(size, stride, storage offset, dtype, device, requires_grad) of each
    of a first call's fake `outputs`; UNRECORDABLE when one is not a plain
    fake tensor of static shape."""
    from torch._subclasses.fake_tensor import FakeTensor

    record = []
    for out in outputs:
        if type(out) is not FakeTensor:
            return UNRECORDABLE
        numbers = (*out.shape, *out.stride(), out.storage_offset())
        if not all(type(n) is int for n in numbers):
            return UNRECORDABLE
        record.append((tuple(out.shape), tuple(out.stride()), out.storage_offset(),
                       str(out.dtype).removeprefix("torch."), str(out.device),
                       out.requires_grad))  # fmt: skip
    return tuple(record)


def readable(record: Any) -> bool:
    """Whether `record`, as found in a cache entry, is one that
    :func:`made_again` can make outputs from. An entry's key does not cover
    pod-init's version, so a record written in another form, or by anything
    else, counts as none at all."""
    import torch

    def integers(value: Any) -> bool:
        return type(value) is tuple and all(type(n) is int and n >= 0 for n in value)

    def output(item: Any) -> bool:
        if type(item) is not tuple or len(item) != 6:
            return False
        size, stride, offset, dtype, device, requires_grad = item
        return (integers(size) and integers(stride) and len(size) == len(stride)
                and type(offset) is int and offset >= 0 and type(dtype) is str
                and isinstance(getattr(torch, dtype, None), torch.dtype)
                and type(device) is str and type(requires_grad) is bool)  # fmt: skip

    return type(record) is tuple and all(output(item) for item in record)


def made_again(record: tuple[Output, ...], fake_mode: Any) -> list[Any]:
    """The fake outputs `record` describes, made in `fake_mode`."""
    import torch

    outputs = []
    with fake_mode:
        for size, stride, offset, dtype, device, requires_grad in record:
            span = 1 + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
            elements = offset + span if all(size) else offset
            base = torch.empty(elements, dtype=getattr(torch, dtype), device=device)
            out = base.as_strided(size, stride, offset)
            outputs.append(out.requires_grad_() if requires_grad else out)
    return outputs


def first_call_fake(compiled: Callable[..., Any], record: tuple[Output, ...],
                    fake_mode: Any) -> Callable[..., Any]:  # fmt: skip
    """`compiled` (boxed: called with a list), whose first call returns the
    recorded fake outputs instead of running."""
    pending = True

    @functools.wraps(compiled)
    def first_call_fake(runtime_args: list[Any]) -> Any:
        nonlocal pending
        if pending:
            pending = False
            return made_again(record, fake_mode)
        return compiled(runtime_args)

    return first_call_fake


def replayable(entry: Any) -> bool:
    """Whether `entry`'s forward sits right under its first call: no
    subclass, RNG-state or effect-token wrapper between them."""
    meta = entry.runtime_metadata
    return (entry.maybe_subclass_meta is None and not getattr(meta, "tokens", None)
            and not getattr(meta, "num_graphsafe_rng_states", 0)
            and not getattr(meta, "is_rng_op_functionalized", False))  # fmt: skip


def mark(compiled: Any, record: tuple[Output, ...] | str) -> None:
    """`record` on a compiled forward, for its cache entry to take."""
    # A callable without attributes: its entry has no record, and a fakified
    # start passes it over.
    with contextlib.suppress(AttributeError):
        setattr(compiled, RECORD, record)


_installed = False


def install() -> None:
    """The hooks, once, unless switched off or torch lacks the parts."""
    global _installed
    if _installed or switch(os.environ) == "off":
        return
    try:
        from torch._functorch._aot_autograd import aot_autograd_result, autograd_cache
        from torch._functorch._aot_autograd.runtime_wrappers import FakifiedOutWrapper
        from torch._guards import TracingContext

        cache = autograd_cache.AOTAutogradCache
        result = aot_autograd_result.GenericAOTAutogradResult
        parts = (autograd_cache.check_cacheable, autograd_cache.BypassAOTAutogradCache,
                 cache.make_entry, cache.save, result.wrap_post_compile,
                 FakifiedOutWrapper.post_compile,
                 FakifiedOutWrapper._compute_output_meta_with_inductor_strides)  # fmt: skip
    except (ImportError, AttributeError):
        return
    check, bypass, make_entry, save, wrap_post_compile, post_compile, _ = parts
    _installed = True

    def fakified() -> Any:
        """The tracing context of a DDP piece's compile, else None."""
        context = TracingContext.try_get()
        return context if context is not None and context.fakify_first_call else None

    # Each hook passes on whatever torch passes it, so that a parameter a
    # later torch adds reaches torch's own function.
    @functools.wraps(check)
    def check_cacheable(*args: Any, **kwargs: Any) -> None:
        context = fakified()
        if context is None:
            return check(*args, **kwargs)
        # Every other reason to refuse the graph still holds.
        context.fakify_first_call = False
        try:
            return check(*args, **kwargs)
        finally:
            context.fakify_first_call = True

    @functools.wraps(post_compile)
    def recording_post_compile(self: Any, *args: Any, **kwargs: Any) -> Any:
        wrapped = post_compile(self, *args, **kwargs)
        if self.needs_post_compile:  # the fakifying wrapper: the forward its entry is made of
            mark(wrapped, record_of(self._compute_output_meta_with_inductor_strides()))
        return wrapped

    @functools.wraps(make_entry)
    def recording_make_entry(*args: Any, **kwargs: Any) -> Any:
        entry = make_entry(*args, **kwargs)
        compiled_fw = args[0] if args else kwargs.get("compiled_fw_func")
        record = getattr(compiled_fw, RECORD, None)
        if record is not None:
            setattr(entry, RECORD, record)
        return entry

    @functools.wraps(save)
    def recorded_save(*args: Any, **kwargs: Any) -> None:
        entry = args[1] if len(args) > 1 else kwargs.get("entry")
        # A piece whose first call cannot be made again: passed over at the next start.
        if getattr(entry, RECORD, None) != UNRECORDABLE:
            save(*args, **kwargs)

    @functools.wraps(wrap_post_compile)
    def replaying_wrap_post_compile(self: Any, *args: Any, **kwargs: Any) -> Any:
        context = fakified()
        if context is None:
            return wrap_post_compile(self, *args, **kwargs)
        record = getattr(self, RECORD, None)
        if not readable(record) or not replayable(self):
            raise bypass("pod-init: no record of this DDP piece's first call to make again")
        forward = self.compiled_fw
        forward_post_compile = forward.post_compile

        def replaying_post_compile(compiled: Any, *rest: Any, **named: Any) -> Any:
            return first_call_fake(forward_post_compile(compiled, *rest, **named), record,
                                   context.fake_mode)  # fmt: skip

        forward.post_compile = replaying_post_compile
        try:
            compiled = wrap_post_compile(self, *args, **kwargs)
        finally:
            del forward.post_compile
        # What a compile leaves for DDP's optimizer, which keeps one per piece.
        context.fw_metadata = self.runtime_metadata
        return compiled

    autograd_cache.check_cacheable = check_cacheable
    FakifiedOutWrapper.post_compile = recording_post_compile
    cache.make_entry = staticmethod(recording_make_entry)
    cache.save = staticmethod(recorded_save)
    result.wrap_post_compile = replaying_wrap_post_compile
