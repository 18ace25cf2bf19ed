"""Nodes on one machine: network namespaces on a bridge, each with its own
address on eth0 (the tests' three and eight nodes, and the SLURM cluster's).
Root only, but for ``free_port``."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on at `host` now ("" for every address)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def add_nodes(tag: str, addresses: list[str], bridge_address: str | None = None) -> list[str]:
    """Namespaces TAGn0, TAGn1, ... on bridge TAGbr, node i at addresses[i]/24;
    the bridge gets bridge_address (the host's place on that network) when given.
    Returns the namespaces' names."""
    bridge = f"{tag}br"
    _ip("link", "add", bridge, "type", "bridge")
    if bridge_address:
        _ip("addr", "add", f"{bridge_address}/24", "dev", bridge)
    _ip("link", "set", bridge, "up")
    names = []
    for i, address in enumerate(addresses):
        ns = f"{tag}n{i}"
        _ip("netns", "add", ns)
        names.append(ns)
        _ip("link", "add", f"{tag}v{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", f"{tag}v{i}", "master", bridge, "up")
        _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
    return names


def kill_all(ns: str, check: bool = True) -> None:
    """KILLs every process in namespace `ns` (a node's whole tree: torchrun
    starts its workers in sessions of their own, so a process group is not
    enough); with `check`, a namespace that cannot be listed is an error."""
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=check)
    for pid in pids.stdout.split():
        # One that ended between the listing and the kill is gone as wanted.
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def remove_nodes(tag: str, count: int) -> None:
    """KILLs whatever still runs in the namespaces, deletes them and the bridge.
    Never fails: a half-made set goes too."""
    for i in range(count):
        ns = f"{tag}n{i}"
        kill_all(ns, check=False)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    subprocess.run(["ip", "link", "del", f"{tag}br"], capture_output=True)
