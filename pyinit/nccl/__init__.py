"""NCCL configuration for this node: the native core builds the topology file,
the ring graph, the env file and the hosts lines; this layer adds what only
NVML knows (NVLinks, compute capability) when a driver is there, and a
tuning measured on this kind of node (``pyinit.nccl.tuning``) when there is
one."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from pyinit import _native
from pyinit.errors import InputError
from pyinit.jsonfile import read_input
from pyinit.pci_scan import scan_native
from pyinit.say import say

if TYPE_CHECKING:  # the tables' module (statistics, hashing) only when a tuning is made,
    from pyinit.nccl.tuning import Tuning  # NVML's only when its view is read
    from pyinit.nvml import NvmlView
    from pyinit.topology import Topology  # its dataclasses only when a caller made one


def resolve_hostfile(path: str) -> str:
    """The hostfile's text with every host name replaced by its address, once,
    now: the core and everything after it never wait on DNS. Line numbers stay
    (a name that expands to several hosts becomes a comma list on its line).
    Raises ``InputError`` naming the file and line for bad content, ``OSError``
    when the file cannot be read."""
    raw = read_input(path)
    lines = []
    for number, line_bytes in enumerate(raw.splitlines(), start=1):
        try:
            line = line_bytes.decode("utf-8")
        except UnicodeDecodeError as e:
            byte = line_bytes[e.start]
            raise InputError(
                f"not UTF-8 text (byte 0x{byte:02x})", file=path, line=number
            ) from None
        content, hash_mark, comment = line.partition("#")
        fields = content.split()
        if fields:
            try:
                hosts = _native.expand_nodelist(fields[0])
            except ValueError as e:
                raise InputError(str(e), file=path, line=number) from None
            fields[0] = ",".join(_address(path, number, host) for host in hosts)
        lines.append(" ".join(fields) + (" " + hash_mark + comment if hash_mark else ""))
    return "\n".join(lines) + "\n"


def _address(path: str, line: int, host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    import socket  # only for a name: a hostfile of addresses, the usual one, never needs it

    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        reason = e.strerror if isinstance(e, socket.gaierror) else str(e)
        raise InputError(f"cannot resolve '{host}': {reason}", file=path, line=line) from None
    return str(found[0][4][0])


def load_nodes(hostfile: str, *, dns: bool = True, node: int | None = None) -> _native.NodeList:
    """This node among the hostfile's nodes, the file read once: host names
    resolved here (``dns=False``: names are an error, as in the executable,
    which never resolves). ``node``: plan for that node of the hostfile
    instead (another machine: its addresses are not looked for here).
    ``InputError`` naming the file and line for bad content, ``OSError`` when
    the file cannot be read."""
    text = resolve_hostfile(hostfile) if dns and hostfile else ""
    return _native.load_node_list(os.fsencode(hostfile), text, -1 if node is None else node)


def configure(
    sysfs_root: str = "/sys",
    *,
    topology: Topology | None = None,
    nodes: _native.NodeList | None = None,
    hints: str | None = None,
    hostfile: str | None = None,
    out_dir: str = ".",
    socket_ifname: str | None = None,
    force_rings: bool = False,
    channels: int | None = None,
    nvml: NvmlView | None = None,
    environment: Mapping[str, str] | None = None,
    proc_root: str = "/proc",
    dns: bool = True,
    node: int | None = None,
    tuning: Tuning | None = None,
) -> _native.NcclConfig:
    """Builds the configuration without writing it; call ``.write()`` for that.

    ``topology`` and ``nodes`` are used as given (a scan and a node list made
    once per run); without them ``sysfs_root`` is scanned and ``hostfile``
    loaded (see :func:`load_nodes`; ``node`` plans for that node of it).

    ``environment`` (default ``os.environ``): ``NCCL_*`` values set there win
    over pod-init's and are reported. ``tuning``: its whole-run settings go
    into the env file and its table beside it. Raises ``ValueError``
    (``pyinit.errors.InputError``, naming the file and line) for bad input and
    ``OSError`` when a file cannot be read.
    """
    # The core's scan as it is: the plan reads nothing of the Python view.
    native = topology._native if topology is not None else scan_native(sysfs_root, None, False)
    if nodes is None and (hostfile or node is not None):
        nodes = load_nodes(hostfile or "", dns=dns, node=node)  # the core checks the pair
    env = os.environ if environment is None else environment
    # Only NCCL's own settings concern the core. Paths and values as bytes: a
    # folder's name or a variable need not be UTF-8.
    nccl_env = {os.fsencode(k): os.fsencode(v) for k, v in env.items() if k.startswith("NCCL_")}
    return _native.nccl_config(
        native,
        nodes=nodes,
        hints=os.fsencode(hints or ""),
        out_dir=os.fsencode(out_dir),
        socket_ifname=socket_ifname or "",
        force_rings=force_rings,
        channels=channels or 0,
        details=nvml.details() if nvml is not None else {},
        environment=nccl_env,
        proc_root=os.fsencode(proc_root),
        tuned_env=tuning.env if tuning else {},
        tuning_table=tuning.to_json() if tuning else "",
    )


def tune(
    topology: Topology,
    nvml: NvmlView,
    *,
    cache: Path,
    retune: bool = False,
    budget: float = 45.0,
    collectives: tuple[str, ...] = ("allreduce", "reducescatter", "allgather"),
    max_bytes: int = 8 << 30,
) -> tuple[Tuning, bool]:
    """This node's tuning: the cached table for its kind when there is one
    (unless ``retune``), else measured on its GPUs (``budget`` seconds of
    timing) and cached. Returns (tuning, whether it came from the cache).

    ``InputError`` for a node it cannot tune (fewer than two GPUs);
    ``pyinit.nccl.measure.MeasurementFailed`` when the ranks fail or NCCL
    returns wrong results (the node is unhealthy)."""
    from pyinit.nccl import measure
    from pyinit.nccl.tuning import choose, installed_nccl_version, node_kind
    from pyinit.nccl.tuning_cache import cached, cached_for_hardware, store

    gpus = len(nvml.gpus)
    if gpus < 2:
        raise InputError(f"--tune times collectives between GPUs; this node has {gpus}")
    version = installed_nccl_version()
    if not retune:
        # NCCL's version unknown here (not from a pip package): a table for
        # exactly this hardware, whatever NCCL measured it, rather than a
        # measurement that cannot be compared with it either.
        hit = (cached(node_kind(topology, nvml, version), cache) if version
               else cached_for_hardware(topology, nvml, cache))  # fmt: skip
        if hit is not None:
            return hit, True
    result = measure.run(gpus, collectives=list(collectives), budget=budget,
                         min_bytes=64 << 10, max_bytes=max_bytes, bounds=[16, 24, 32])  # fmt: skip
    wrong = sorted(name for name, count in result.wrong.items() if count)
    if wrong:
        raise measure.MeasurementFailed("NCCL returned wrong results for: " + ", ".join(wrong))
    tuning = choose(result.timings, node_kind(topology, nvml, result.nccl_version))
    tuning.seconds = result.seconds
    try:
        store(tuning, cache)
    except OSError as e:
        # The measurement stands for this run; only the next boot measures again.
        say(f"pyinit nccl: not cached ({e.filename}: {e.strerror})")
    return tuning, False
