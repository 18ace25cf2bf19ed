"""Which nodes a run spans and which one this is, from (in order) a hostfile
(IP addresses, node 0 the master; this node found by its own addresses),
SLURM (``SLURM_JOB_NODELIST``, ``SLURM_NODEID``, ``SLURM_NNODES``),
``MASTER_ADDR`` with ``NODE_RANK`` and ``NNODES`` (or ``WORLD_SIZE``), else
this node alone."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from pyinit import _native
from pyinit.errors import InputError


@dataclass(frozen=True)
class Nodes:
    count: int
    rank: int
    master: str
    source: str  # hostfile, slurm, environment, single
    addresses: tuple[str, ...] = ()  # every node's address, when known
    interface: str = ""  # the one holding this node's address (hostfile only)
    # The hostfile's node list as the core loaded it, handed to the NCCL builder as it is.
    native: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "native"}


def find_nodes(hostfile: str | None, env: Mapping[str, str]) -> Nodes:
    if hostfile:
        from pyinit.nccl import load_nodes

        native = load_nodes(hostfile)  # read and resolved once for the whole run
        addresses = tuple(native.addresses)
        return Nodes(len(addresses), native.node_rank, addresses[0], "hostfile", addresses,
                     native.interface, native)  # fmt: skip
    if "SLURM_JOB_NODELIST" in env:
        try:
            names = _native.expand_nodelist(env["SLURM_JOB_NODELIST"])
        except ValueError as e:
            listed = env["SLURM_JOB_NODELIST"]
            shown = repr(listed) if len(listed) <= 64 else repr(listed[:64]) + "..."
            raise InputError(f"SLURM_JOB_NODELIST={shown}: {e}") from None
        count = _int_env(env, "SLURM_NNODES", len(names))
        rank = _int_env(env, "SLURM_NODEID", 0)
        _check_rank(rank, count, "SLURM_NODEID")
        # torchrun would retry an unresolvable master for minutes: find out now, once.
        try:
            socket.getaddrinfo(names[0], None, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise InputError(
                f"SLURM_JOB_NODELIST: the master {names[0]!r} does not resolve: {reason}"
            ) from None
        return Nodes(count, rank, names[0], "slurm", tuple(names))
    if "MASTER_ADDR" in env:
        count = _int_env(env, "NNODES", _int_env(env, "WORLD_SIZE", 1))
        rank = _int_env(env, "NODE_RANK", _int_env(env, "GROUP_RANK", 0))
        _check_rank(rank, count, "NODE_RANK")
        return Nodes(count, rank, env["MASTER_ADDR"], "environment")
    return Nodes(1, 0, "127.0.0.1", "single", ("127.0.0.1",))


def _int_env(env: Mapping[str, str], key: str, default: int) -> int:
    if key not in env:
        return default
    try:
        return int(env[key])
    except ValueError:
        raise InputError(f"{key}={env[key]!r} is not a whole number") from None


def _check_rank(rank: int, count: int, key: str) -> None:
    if count < 1 or not 0 <= rank < count:
        raise InputError(f"{key}={rank} does not fit {count} nodes")
