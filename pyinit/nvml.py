"""NVML's view of the GPUs: NVLinks and their peers, P2P status, common
ancestors, BAR1, memory, PCIe generation and width.

Everything goes through a small backend interface: :class:`DriverNvml`
talks to the driver's own NVML library through the native core, which loads
it only when asked; :class:`FakeNvml` replays recorded
values on machines without a driver (tests, a CPU laptop). Without either,
:func:`read_nvml` raises :class:`NvmlUnavailable` with the reason, and callers
carry on from sysfs alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pyinit.quiet_thread import start_quiet
from pyinit.say import say

# What health() reports: ECC mode, uncorrected ECC errors since the driver
# loaded, and row remapping (HBM parts: rows remapped for uncorrectable errors,
# a remap waiting for a GPU reset, a remap that failed).
HEALTH_KEYS = ("ecc_enabled", "ecc_uncorrected_volatile", "remapped_uncorrectable",
               "remap_pending", "remap_failed")  # fmt: skip

COUNTER_KEYS = ("uuid", "utilization_percent", "memory_used_bytes", "pcie_tx_bytes_per_s",
                "pcie_rx_bytes_per_s", "temperature_celsius", "nvlink_tx_bytes_total",
                "nvlink_rx_bytes_total")  # fmt: skip

# nvmlDeviceGetP2PStatus capability indices, in NVML's order.
P2P_CAPABILITIES = ("read", "write", "nvlink", "atomics", "pci")
# nvmlGpuP2PStatus_t, abbreviated the way `nvidia-smi topo -p2p` prints it.
P2P_STATUS = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DIS", 5: "NS", 6: "U"}
# nvmlGpuTopologyLevel_t
ANCESTOR_LEVELS = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
# nvmlNvLinkDeviceType_t values that name a peer kind
_REMOTE_GPU, _REMOTE_SWITCH = 0, 2


def nvlink_gbs(sm: int) -> float:
    """GB/s one NVLink carries one way, as NCCL models it by compute capability."""
    if sm >= 100:
        return 40.1
    if sm >= 90:
        return 20.6
    if sm == 86:
        return 12.0
    return 20.0


def normalize_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:00:06.0`` as sysfs writes it: ``0000:00:06.0``."""
    text = bus_id.strip().lower()
    try:
        domain, bus, slot = text.split(":")
        return f"{int(domain, 16):04x}:{bus}:{slot}"
    except ValueError:
        return text  # not a bus id (an NVSwitch may report anything): keep it as given


class NvmlUnavailable(RuntimeError):
    """No NVML here (no driver, no GPU), or a query it refused. The text says which."""


class NvmlBackend(Protocol):
    """The NVML calls pyinit makes; handles are whatever the backend uses."""

    def open(self) -> None: ...
    def close(self) -> None: ...
    def driver_version(self) -> str: ...
    def device_count(self) -> int: ...
    def handle(self, index: int) -> Any: ...
    def bus_id(self, handle: Any) -> str: ...
    def name(self, handle: Any) -> str: ...
    def cuda_capability(self, handle: Any) -> tuple[int, int]: ...
    def memory_total(self, handle: Any) -> int: ...
    def bar1_total(self, handle: Any) -> int: ...
    def pcie_link(self, handle: Any) -> tuple[int, int, int, int]:
        """(current generation, max generation, current width, max width)."""
        ...

    def nvlinks(self, handle: Any) -> list[tuple[int, str, int | None]]:
        """Active links: (link, remote bus id, nvmlNvLinkDeviceType_t or None)."""
        ...

    def p2p_status(self, a: Any, b: Any, capability: int) -> int: ...
    def common_ancestor(self, a: Any, b: Any) -> int: ...
    def health(self, handle: Any) -> dict[str, Any]:
        """HEALTH_KEYS; a value is None where the GPU does not support the query."""
        ...

    def counters(self, handle: Any) -> dict[str, Any]:
        """COUNTER_KEYS now: what the monitor samples."""
        ...

    def watch_xid(self, handles: list[Any]) -> None: ...
    def xid_events(self) -> list[tuple[int, int]]:
        """(GPU index, XID) for each event since the last call; never blocks."""
        ...


DEFAULT_LIBRARY = "libnvidia-ml.so.1"


class _Init:
    """NVML loaded and initialised in a thread of its own, started at once,
    with every asynchronous signal blocked: the thread of libcuda's that
    nvmlInit starts (driver 580) inherits that mask, and so never takes a
    signal sent to this process. With the mask open there, a TERM to ``pyinit
    run``, which blocks its signals and takes them with sigtimedwait, could go
    to that thread, whose default action ended the process; a Ctrl-C became a
    KeyboardInterrupt mid-wait (both seen on an H200 node). The caller's own
    mask is closed only while the thread starts: a driver that hangs in
    nvmlInit still leaves it interruptible."""

    def __init__(self, library: str) -> None:
        from pyinit import _native

        self.gpus = _native.NvmlGpus()
        self.problem = ""
        self._thread = threading.Thread(target=self._open, args=(library,), name="nvml-init",
                                        daemon=True)  # fmt: skip
        start_quiet(self._thread)

    def _open(self, library: str) -> None:
        self.problem = self.gpus.open(library)

    def finish(self) -> None:
        self._thread.join()

    def result(self) -> Any:
        """The initialised NVML; NvmlUnavailable saying why not."""
        self.finish()
        if self.problem:
            raise NvmlUnavailable(f"NVML did not initialise: {self.problem}")
        return self.gpus


# nvmlInit holds the caller for most of a health check's time (87 ms on an
# H200 node, in the driver, without the GIL), so a command that will need NVML
# can start it before its own imports and parsing; the first open() takes it.
_early_init: _Init | None = None


def begin_driver_init() -> None:
    """Loads and initialises NVML in a thread now, for the DriverNvml that
    opens next; its failure is reported by that open()."""
    global _early_init

    if _early_init is None:
        _early_init = _Init(DEFAULT_LIBRARY)


def end_driver_init() -> None:
    """An early init that no open() took (the command ended first: its
    --help, a usage error), waited for and dropped: a process that exits
    while another of its threads is inside nvmlInit runs the library's
    destructors under it."""
    global _early_init

    init, _early_init = _early_init, None
    if init is not None:
        init.finish()


class DriverNvml:
    """The real driver: its NVML library, through the native core."""

    def __init__(self, library: str = DEFAULT_LIBRARY) -> None:
        self._library = library
        self._gpus: Any = None

    def open(self) -> None:
        global _early_init

        init, _early_init = _early_init, None
        if init is None or self._library != DEFAULT_LIBRARY:
            init = _Init(self._library)
        self._gpus = init.result()

    def close(self) -> None:
        self._gpus = None  # nvmlShutdown with its last reference

    def driver_version(self) -> str:
        return str(self._gpus.driver_version())

    def device_count(self) -> int:
        return self._gpus.count

    def handle(self, index: int) -> Any:
        return index

    # The core's answers are already the protocol's types.
    def bus_id(self, handle: Any) -> str:
        return self._gpus.bus_id(handle)

    def name(self, handle: Any) -> str:
        return self._gpus.name(handle)

    def cuda_capability(self, handle: Any) -> tuple[int, int]:
        return self._gpus.cuda_capability(handle)

    def memory_total(self, handle: Any) -> int:
        return self._gpus.memory_total(handle)

    def bar1_total(self, handle: Any) -> int:
        return self._gpus.bar1_total(handle)

    def pcie_link(self, handle: Any) -> tuple[int, int, int, int]:
        return self._gpus.pcie_link(handle)

    def nvlinks(self, handle: Any) -> list[tuple[int, str, int | None]]:
        return self._gpus.nvlinks(handle)

    def p2p_status(self, a: Any, b: Any, capability: int) -> int:
        return self._gpus.p2p_status(a, b, capability)

    def common_ancestor(self, a: Any, b: Any) -> int:
        return self._gpus.common_ancestor(a, b)

    def health(self, handle: Any) -> dict[str, Any]:
        return self._gpus.health(handle)

    def counters(self, handle: Any) -> dict[str, Any]:
        return self._gpus.counters(handle)

    def watch_xid(self, handles: list[Any]) -> None:
        # Unsupported in some VMs and on some parts: then no XIDs, the other counters still work.
        self._gpus.watch_xids(handles)

    def xid_events(self) -> list[tuple[int, int]]:
        return self._gpus.xid_events()


class FakeNvml:
    """Recorded NVML answers, for machines without a driver.

    ``spec``: ``driver`` and ``gpus``, a list of dicts with ``bus_id``,
    ``name``, ``sm`` (``[9, 0]``), ``memory_total``, ``bar1_total``, ``pcie``
    (four ints), ``nvlinks`` (``[link, remote bus id, remote type]`` lists),
    optionally ``health`` (HEALTH_KEYS; missing keys read as unsupported) and
    ``samples`` (COUNTER_KEYS dicts the monitor reads in turn); ``xids`` lists
    ``[gpu, xid]`` events;
    ``p2p`` maps ``"i,j"`` to five statuses and ``ancestors`` maps ``"i,j"`` to
    a level (both default to OK and PHB).
    """

    def __init__(self, spec: Mapping[str, Any]) -> None:
        self._spec = spec
        self._taken: dict[Any, int] = {}
        self._xids: list[tuple[int, int]] = []

    @staticmethod
    def record(backend: NvmlBackend) -> dict[str, Any]:
        """Asks ``backend`` (the real driver) everything and returns a spec
        that replays it (``pyinit nvml --record > recording.json``)."""
        backend.open()
        try:
            handles = [backend.handle(i) for i in range(backend.device_count())]
            spec: dict[str, Any] = {"driver": backend.driver_version(), "gpus": []}
            for h in handles:
                spec["gpus"].append(
                    {
                        "bus_id": backend.bus_id(h),
                        "name": backend.name(h),
                        "sm": list(backend.cuda_capability(h)),
                        "memory_total": backend.memory_total(h),
                        "bar1_total": backend.bar1_total(h),
                        "pcie": list(backend.pcie_link(h)),
                        "nvlinks": [list(link) for link in backend.nvlinks(h)],
                        "health": backend.health(h),
                    }
                )
            pairs = [(a, b) for a in range(len(handles)) for b in range(len(handles)) if a != b]
            spec["p2p"] = {
                f"{a},{b}": [backend.p2p_status(handles[a], handles[b], i) for i in range(5)]
                for a, b in pairs
            }
            spec["ancestors"] = {
                f"{a},{b}": backend.common_ancestor(handles[a], handles[b]) for a, b in pairs
            }
            return spec
        finally:
            backend.close()

    def open(self) -> None:
        # A recording may say its driver answered late (`delay_s`): how a test
        # stands in for an NVML call that hangs on a faulty GPU.
        time.sleep(float(self._spec.get("delay_s", 0)))
        if not self._spec.get("gpus"):
            raise NvmlUnavailable("no GPU in the recorded NVML data")

    def close(self) -> None:
        pass

    def driver_version(self) -> str:
        return str(self._spec.get("driver", "fake"))

    def device_count(self) -> int:
        return len(self._spec["gpus"])

    def handle(self, index: int) -> Any:
        return index

    def bus_id(self, handle: Any) -> str:
        return str(self._spec["gpus"][handle]["bus_id"])

    def name(self, handle: Any) -> str:
        return str(self._spec["gpus"][handle]["name"])

    def cuda_capability(self, handle: Any) -> tuple[int, int]:
        major, minor = self._spec["gpus"][handle]["sm"]
        return int(major), int(minor)

    def memory_total(self, handle: Any) -> int:
        return int(self._spec["gpus"][handle]["memory_total"])

    def bar1_total(self, handle: Any) -> int:
        return int(self._spec["gpus"][handle]["bar1_total"])

    def pcie_link(self, handle: Any) -> tuple[int, int, int, int]:
        gen, max_gen, width, max_width = self._spec["gpus"][handle]["pcie"]
        return int(gen), int(max_gen), int(width), int(max_width)

    def nvlinks(self, handle: Any) -> list[tuple[int, str, int | None]]:
        links = self._spec["gpus"][handle].get("nvlinks", [])
        return [(int(link), str(remote), kind) for link, remote, kind in links]

    def p2p_status(self, a: Any, b: Any, capability: int) -> int:
        return int(self._spec.get("p2p", {}).get(f"{a},{b}", [0] * 5)[capability])

    def common_ancestor(self, a: Any, b: Any) -> int:
        return int(self._spec.get("ancestors", {}).get(f"{a},{b}", 30))

    def health(self, handle: Any) -> dict[str, Any]:
        recorded = self._spec["gpus"][handle].get("health", {})
        return {key: recorded.get(key) for key in HEALTH_KEYS}

    def counters(self, handle: Any) -> dict[str, Any]:
        """The next of the GPU's recorded ``samples`` (the last one repeats)."""
        gpu = self._spec["gpus"][handle]
        samples = gpu.get("samples") or [{}]
        taken = self._taken.get(handle, 0)
        self._taken[handle] = taken + 1
        recorded = samples[min(taken, len(samples) - 1)]
        defaults = {"uuid": f"GPU-fake-{handle}", "utilization_percent": 0.0,
                    "memory_used_bytes": 0, "pcie_tx_bytes_per_s": 0.0,
                    "pcie_rx_bytes_per_s": 0.0, "temperature_celsius": 30.0,
                    "nvlink_tx_bytes_total": None, "nvlink_rx_bytes_total": None}  # fmt: skip
        return {key: recorded.get(key, defaults[key]) for key in COUNTER_KEYS}

    def watch_xid(self, handles: list[Any]) -> None:
        self._xids = [tuple(x) for x in self._spec.get("xids", [])]

    def xid_events(self) -> list[tuple[int, int]]:
        found, self._xids = self._xids, []
        return found


@dataclass(frozen=True)
class NvLink:
    link: int
    remote_bdf: str
    peer: str  # "gpu" or "switch"


@dataclass(frozen=True)
class NvmlGpu:
    index: int
    bdf: str
    name: str
    sm: int  # compute capability x10
    memory_total: int  # bytes
    bar1_total: int  # bytes
    pcie_generation: int
    pcie_max_generation: int
    pcie_width: int
    pcie_max_width: int
    nvlinks: tuple[NvLink, ...]
    health: Mapping[str, Any] = field(default_factory=dict)  # HEALTH_KEYS


@dataclass(frozen=True)
class GpuPair:
    a: int
    b: int
    common_ancestor: str  # PIX, PXB, PHB, NODE, SYS
    p2p: Mapping[str, str] = field(default_factory=dict)  # capability -> OK, CNS, ...


@dataclass(frozen=True)
class NvmlView:
    driver: str
    gpus: tuple[NvmlGpu, ...]
    pairs: tuple[GpuPair, ...]

    def details(self) -> dict[str, tuple[int, float, list[tuple[str, str, int]]]]:
        """Per GPU BDF: (sm, GB/s per link, [(peer BDF or switch, kind, links)]),
        the form the native core merges into its matrix and rings."""
        out = {}
        for gpu in self.gpus:
            groups: dict[tuple[str, str], int] = {}
            for link in gpu.nvlinks:
                target = link.remote_bdf if link.peer == "gpu" else "switch"
                groups[(target, link.peer)] = groups.get((target, link.peer), 0) + 1
            out[gpu.bdf] = (
                gpu.sm,
                nvlink_gbs(gpu.sm),
                [(target, peer, count) for (target, peer), count in sorted(groups.items())],
            )
        return out

    def to_text(self) -> str:
        """A GPU table and the P2P read matrix, like ``nvidia-smi topo -p2p r``."""
        lines = [f"NVML (driver {self.driver}):"]
        for g in self.gpus:
            switch_links = sum(1 for link in g.nvlinks if link.peer == "switch")
            peer_links = len(g.nvlinks) - switch_links
            nvl = f"{switch_links} to NVSwitch" if switch_links else ""
            if peer_links:
                nvl += (", " if nvl else "") + f"{peer_links} to GPUs"
            lines.append(
                f"  GPU{g.index}  {g.bdf}  {g.name}  sm{g.sm}  "
                f"memory {g.memory_total / 2**30:.0f} GiB  BAR1 {g.bar1_total / 2**30:.0f} GiB  "
                f"PCIe gen {g.pcie_generation}/{g.pcie_max_generation} "
                f"x{g.pcie_width}/{g.pcie_max_width}  NVLinks {len(g.nvlinks)}"
                + (f" ({nvl})" if nvl else "")
            )
        if len(self.gpus) > 1:
            lines.append("  P2P read/write/nvlink/atomics, common ancestor:")
            for p in self.pairs:
                status = "/".join(p.p2p[c] for c in P2P_CAPABILITIES[:4])
                lines.append(f"    GPU{p.a}-GPU{p.b}  {status}  {p.common_ancestor}")
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        return {
            "driver": self.driver,
            "gpus": [
                {**g.__dict__, "nvlinks": [link.__dict__ for link in g.nvlinks]} for g in self.gpus
            ],
            "pairs": [{**p.__dict__, "p2p": dict(p.p2p)} for p in self.pairs],
        }


def load_replay(path: str) -> FakeNvml:
    """A recording (`pyinit nvml --record`) to answer as the driver would.
    OSError when it cannot be read, InputError naming it when it is not JSON."""
    from pyinit.jsonfile import load_json, read_input_text

    return FakeNvml(load_json(read_input_text(path), path))


def backend_for(args: Any) -> NvmlBackend | None:
    """The NVML a command's arguments name: the recording of --nvml-replay,
    else the one the caller put in ``args.nvml_backend`` (a test's FakeNvml),
    else None, the driver."""
    if getattr(args, "nvml_replay", None):
        return load_replay(args.nvml_replay)
    return getattr(args, "nvml_backend", None)


def optional_view(args: Any) -> NvmlView | None:
    """NVML's view for a command that works without it: None under --no-nvml,
    or with a line on stderr saying why NVML could not be read."""
    if args.no_nvml:
        return None
    try:
        return read_nvml(backend_for(args))
    except NvmlUnavailable as e:
        say(f"pyinit: NVML unavailable ({e}); working from sysfs alone")
        return None


def read_nvml(backend: NvmlBackend | None = None) -> NvmlView:
    """Reads every GPU's NVML view. Raises :class:`NvmlUnavailable`."""
    nvml = backend if backend is not None else DriverNvml()
    nvml.open()
    try:
        count = nvml.device_count()
        if count == 0:
            raise NvmlUnavailable("NVML sees no GPU")
        handles = [nvml.handle(i) for i in range(count)]
        bdfs = [normalize_bus_id(nvml.bus_id(h)) for h in handles]
        gpus = []
        for index, handle in enumerate(handles):
            major, minor = nvml.cuda_capability(handle)
            gen, max_gen, width, max_width = nvml.pcie_link(handle)
            links = []
            for link, remote, kind in nvml.nvlinks(handle):
                remote_bdf = normalize_bus_id(remote)
                if kind is None:
                    kind = _REMOTE_GPU if remote_bdf in bdfs else _REMOTE_SWITCH
                links.append(NvLink(link, remote_bdf, "gpu" if kind == _REMOTE_GPU else "switch"))
            gpus.append(
                NvmlGpu(
                    index=index,
                    bdf=bdfs[index],
                    name=nvml.name(handle),
                    sm=major * 10 + minor,
                    memory_total=nvml.memory_total(handle),
                    bar1_total=nvml.bar1_total(handle),
                    pcie_generation=gen,
                    pcie_max_generation=max_gen,
                    pcie_width=width,
                    pcie_max_width=max_width,
                    nvlinks=tuple(links),
                    health=nvml.health(handle),
                )
            )
        pairs = []
        for a in range(count):
            for b in range(a + 1, count):
                p2p = {
                    cap: P2P_STATUS.get(nvml.p2p_status(handles[a], handles[b], i), "U")
                    for i, cap in enumerate(P2P_CAPABILITIES)
                }
                level = nvml.common_ancestor(handles[a], handles[b])
                pairs.append(GpuPair(a, b, ANCESTOR_LEVELS.get(level, str(level)), p2p))
        return NvmlView(nvml.driver_version(), tuple(gpus), tuple(pairs))
    finally:
        nvml.close()
