"""Which nodes a run spans and which one this is, from (in order) a hostfile
(IP addresses, node 0 the master; this node found by its own addresses),
SLURM (``SLURM_STEP_NODELIST`` in a job step, else ``SLURM_JOB_NODELIST``;
``SLURM_NODEID``, ``SLURM_NNODES``),
``MASTER_ADDR`` with ``PET_NNODES`` and ``PET_NODE_RANK`` (torchrun's own),
``NNODES`` and ``NODE_RANK``, or ``WORLD_SIZE`` and ``RANK``, else this node
alone.

Names are resolved once, here: the run's watches ask every node every second
and must not ask a name server each time. A node's own name that resolves to
a loopback address on that node (Debian's installer writes ``127.0.1.1
HOSTNAME`` into /etc/hosts; the other nodes resolve the name to its real
address) is not where the other nodes reach it: it listens on every address
then, as torch's own store does (``listen_at``: the same for an address this
host does not hold), and gloo, which finds its address through the host's
name, is given the interface of the route to the other nodes."""

from __future__ import annotations

import errno
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from pyinit import _native
from pyinit.errors import InputError

JOB_PORTS_FROM, JOB_PORTS = 15000, 5000  # a SLURM job's store port: 15000 to 24998


@dataclass(frozen=True)
class Nodes:
    count: int
    rank: int
    master: str  # where this node reaches the rendezvous store
    source: str  # hostfile, slurm, environment, single
    addresses: tuple[str, ...] = ()  # every node's IP address as resolved here, when known
    names: tuple[str, ...] = ()  # every node as the node list names it, for people to read
    # Where this node's store (on the master) and liveness port listen: its own
    # address, or "" for every address (its name is a loopback one here).
    listen: str = ""
    # The interface gloo is to use: the one holding this node's address (hostfile), or
    # the route's to the other nodes where the host's name resolves to a loopback address.
    interface: str = ""
    # The store's port the environment names (MASTER_PORT, else a SLURM job's own),
    # for want of --master-port.
    port: int | None = None
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
                     addresses, addresses[native.node_rank], native.interface,
                     native)  # fmt: skip
    if "SLURM_JOB_NODELIST" in env:
        # In a job step (srun) the step's nodes, which SLURM_NNODES and SLURM_NODEID
        # count: a step may run on part of the job's nodes (srun -N 2 --relative 1).
        variable = "SLURM_STEP_NODELIST" if env.get("SLURM_STEP_NODELIST") else "SLURM_JOB_NODELIST"
        try:
            names = _native.expand_nodelist(env[variable])
        except ValueError as e:
            raise InputError(f"{variable}={_shown(env[variable])}: {e}") from None
        count = _int_env(env, "SLURM_NNODES", len(names))
        rank = _int_env(env, "SLURM_NODEID", 0)
        _check_rank(rank, count, "SLURM_NODEID")
        if count > len(names):
            raise InputError(f"SLURM_NNODES={count}, but {variable} names "
                             f"{len(names)} node{'s' if len(names) > 1 else ''}")  # fmt: skip
        _one_task_per_node(env.get("SLURM_STEP_TASKS_PER_NODE", ""), names)
        # torchrun would retry an unresolvable master for minutes: find out now, once.
        addresses = _resolve_all(names, variable)
        listen, interface, port = addresses[rank], "", None
        if count > 1:
            for number, address in enumerate(addresses):
                if number != rank and _loopback(address):
                    raise InputError(f"{variable}: node {number} {names[number]!r} "
                                     f"resolves to {address} here, a loopback address: this "
                                     "node could not reach it")  # fmt: skip
            listen = "" if _loopback(listen) else listen
            interface = _gloo_interface(addresses[1 if rank == 0 else 0])
            port = _port_env(env, "MASTER_PORT") or _job_port(env.get("SLURM_JOB_ID", ""))
        return Nodes(count, rank, addresses[0], "slurm", tuple(addresses), tuple(names), listen,
                     interface, port=port)  # fmt: skip
    if "MASTER_ADDR" in env:
        # torchrun's own variables first (Kubernetes' PyTorchJob sets PET_NNODES and
        # PET_NODE_RANK, and then WORLD_SIZE counts processes); an older operator, and
        # the platforms that copy it, count pods in WORLD_SIZE and number them in RANK.
        counted = next((k for k in ("PET_NNODES", "NNODES", "WORLD_SIZE") if k in env), "")
        if ":" in env.get(counted, ""):
            raise InputError(f"{counted}={_shown(env[counted])}: a range of nodes is torchrun's "
                             "elastic mode; pyinit run takes a count of nodes")  # fmt: skip
        count = _int_env(env, counted, 1) if counted else 1
        keys = ("PET_NODE_RANK", "NODE_RANK", "GROUP_RANK")
        keys += ("RANK",) if counted == "WORLD_SIZE" else ()
        key = next((k for k in keys if k in env), "NODE_RANK")
        rank = _int_env(env, key, 0)
        _check_rank(rank, count, key)
        # One node takes a free port whatever the environment says: two runs on one
        # machine (MASTER_PORT=12355, as tutorials set it) must not collide.
        port = _port_env(env, "MASTER_PORT") if count > 1 else None
        master = env["MASTER_ADDR"]
        listen, interface = (master if rank == 0 else ""), ""
        if count > 1:
            try:
                address = _address_of(master)
            except (OSError, UnicodeError):
                address = None  # binding or connecting says why, naming MASTER_ADDR
            if address is not None and rank == 0 and _loopback(address):
                listen = ""
            elif address is not None and rank != 0:
                interface = _gloo_interface(address)
        return Nodes(count, rank, master, "environment", listen=listen, interface=interface,
                     port=port)  # fmt: skip
    return Nodes(1, 0, "127.0.0.1", "single", ("127.0.0.1",), ("127.0.0.1",), "127.0.0.1")


def listen_at(address: str, port: int) -> socket.socket:
    """A TCP socket listening on `port` (0: a free one) at `address` (an IP
    address, or a name resolved here; "" for every address of this host, IPv4
    and IPv6 where it has both). An address this host does not hold (a
    Kubernetes service's, one the network translates) is where the others
    reach this node all the same: every address then, as torch's own store
    listens. As torch's listener, a port left in TIME_WAIT by a run that just
    ended is free to take again. OSError where it cannot listen."""
    if address:
        host = address.encode() if address.isascii() else address  # see _address_of
        family, _, _, _, where = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    elif socket.has_dualstack_ipv6():
        family, where = socket.AF_INET6, ("::", port)
    else:
        family, where = socket.AF_INET, ("0.0.0.0", port)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if not address and family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(where)
        sock.listen(socket.SOMAXCONN)
    except OSError as e:
        sock.close()
        if address and e.errno == errno.EADDRNOTAVAIL:
            return listen_at("", port)
        raise
    return sock


def endpoint(address: str, port: int) -> str:
    """address:port as people write it: [IPv6]:port, *:port for every address."""
    if not address:
        return f"*:{port}"
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _address_of(name: str) -> str:
    """The first address `name` resolves to here. OSError (gaierror) or
    UnicodeError where it does not."""
    # As bytes: a str name makes getaddrinfo load the IDNA codec (unicodedata and
    # all) for names that are ASCII anyway, on every launch's path.
    host = name.encode() if name.isascii() else name
    return str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])


def _resolve_all(names: list[str], variable: str) -> list[str]:
    """Every SLURM node name's address, asked at once (a slow name server is
    paid once, not once per node). InputError naming `variable` (the list's)
    and the first name that does not resolve."""
    from concurrent.futures import ThreadPoolExecutor

    def resolve(name: str) -> str | BaseException:
        try:
            return _address_of(name)
        except (OSError, UnicodeError) as e:
            return e

    with ThreadPoolExecutor(min(16, len(names)), thread_name_prefix="pyinit-resolve") as pool:
        found = list(pool.map(resolve, names))
    addresses = []
    for number, (name, address) in enumerate(zip(names, found, strict=True)):
        if isinstance(address, BaseException):
            reason = address.strerror if isinstance(address, OSError) else None
            which = "the master" if number == 0 else f"node {number}"
            raise InputError(f"{variable}: {which} {name!r} does not resolve: "
                             f"{reason or address}")  # fmt: skip
        addresses.append(address)
    return addresses


def _one_task_per_node(tasks: str, names: list[str]) -> None:
    """InputError where the job step (srun) runs more than one task on a node
    (SLURM_STEP_TASKS_PER_NODE: "2,1", "1(x8)"): a pyinit run starts all of
    its node's ranks itself, and a second one on the node would take the same
    node rank. Every task says so, not only the one that would lose the port."""
    node = 0
    for part in tasks.split(",") if tasks else ():
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part)
        if match is None:
            raise InputError(f"SLURM_STEP_TASKS_PER_NODE={_shown(tasks)}: {_shown(part)} is "
                             "not COUNT or COUNT(xNODES)")  # fmt: skip
        if int(match[1]) > 1:
            where = f"node {node} ({names[node]})" if node < len(names) else f"node {node}"
            raise InputError(f"this job step runs {match[1]} tasks on {where} "
                             f"(SLURM_STEP_TASKS_PER_NODE={_shown(tasks)}): pyinit run starts "
                             "a node's ranks itself (--nproc-per-node); run one task per node "
                             "(srun --ntasks-per-node=1)")  # fmt: skip
        node += int(match[2] or 1)


def _shown(text: str) -> str:
    """A variable's value in a message: quoted, and cut where it is long."""
    return repr(text) if len(text) <= 64 else repr(text[:64]) + "..."


def _loopback(address: str) -> bool:
    return address.startswith("127.") or address == "::1"


def _gloo_interface(towards: str) -> str:
    """The interface gloo is to use where it would choose wrongly by itself:
    it takes the address this host's name resolves to, and a name on a
    loopback address (or none) leaves it out of the other nodes' reach. The
    interface of this host's route towards `towards` (another node's address)
    then; "" where gloo's own choice is right."""
    try:
        own = _address_of(socket.gethostname())
    except (OSError, UnicodeError):
        own = "127.0.0.1"
    return _native.route_to(towards)[0] if _loopback(own) else ""


def _int_env(env: Mapping[str, str], key: str, default: int) -> int:
    if key not in env:
        return default
    try:
        return int(env[key])
    except ValueError:
        raise InputError(f"{key}={env[key]!r} is not a whole number") from None


def _port_env(env: Mapping[str, str], key: str) -> int | None:
    if key not in env:
        return None
    port = _int_env(env, key, 0)
    if not 0 < port < 65535:  # the next port is the liveness port
        raise InputError(f"{key}={env[key]!r} is not a port (1 to 65534)")
    return port


def _job_port(job: str) -> int | None:
    """The store's port of SLURM job `job`, the same on all its nodes, other
    than any job's with an id within 5,000 of it: jobs that share a node (a
    GPU or two each) must not both take 29500. Even, so the liveness port
    (the next) is never another job's store port; below Linux's ephemeral
    ports (32768 on)."""
    if not (job.isascii() and job.isdigit()):
        return None
    return JOB_PORTS_FROM + 2 * (int(job) % JOB_PORTS)


def _check_rank(rank: int, count: int, key: str) -> None:
    if count < 1 or not 0 <= rank < count:
        raise InputError(f"{key}={rank} does not fit {count} nodes")
