"""The rendezvous store's socket: bound by ``pyinit run`` before torchrun
starts, so a taken address is one line naming it (not torch's traceback two
seconds later), and handed to torchrun's agent, which serves torch's
``TCPStore`` on it (``master_listen_fd``) through a rendezvous handler of its
own, registered in torch's handler registry as ``pyinit``.

One node listens on the loopback alone, on a free port unless one is asked
for; several nodes' master listens on its own address from the node list,
not on every interface (unless its name is a loopback address there:
``pyinit.run.nodes``). The handler is torch's static rendezvous otherwise:
the same store, the same ranks, ``timeout`` as the join's limit; when the
store is made (every node has joined, on the master) it leaves a mark for
``pyinit run``'s join watch."""

from __future__ import annotations

import errno
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyinit.run.nodes import Nodes, endpoint, listen_at

BACKEND = "pyinit"
FD_ENV = "PYINIT_STORE_FD"  # the listening socket's descriptor, in the agent
JOINED_FILE = "joined"  # in the run's status folder, once the agent's store is made
DEFAULT_PORT = 29500  # several nodes must agree on one; torchrun's default


@dataclass
class Store:
    """Where the store is (what torchrun is told) and, on the node that
    serves it, the bound socket."""

    host: str
    port: int
    listening: socket.socket | None = None

    @property
    def endpoint(self) -> str:
        return endpoint(self.host, self.port)

    def close(self) -> None:
        if self.listening is not None:
            self.listening.close()


def bind(nodes: Nodes, port: int | None) -> Store:
    """The store of the run over `nodes`: bound here when this node serves it
    (a single node, or the master). OSError naming the address and the
    option when it cannot be bound."""
    if nodes.count == 1:
        host = address = "127.0.0.1"
        port = port or 0
    else:
        host, address = nodes.master, nodes.listen
        port = port or DEFAULT_PORT
        if nodes.rank != 0:
            return Store(host, port)
    try:
        listening = listen_at(address, port)
    except OSError as e:
        why = e.strerror or str(e)
        hint = ""
        if e.errno == errno.EADDRINUSE:
            hint = (" (another run holds it: choose another with --master-port, or leave it "
                    "out on a single node for a free one)")  # fmt: skip
        raise OSError(e.errno, f"cannot listen on {endpoint(address, port)} for the "
                      f"rendezvous store: {why}{hint}") from None  # fmt: skip
    listening.set_inheritable(True)
    return Store(host, listening.getsockname()[1], listening)


def torchrun_options(store: Store, rank: int, join_timeout: float) -> list[str]:
    """torchrun's rendezvous options for this store (instead of --master-addr,
    --master-port and --node-rank, which only the static backend reads)."""
    return ["--rdzv-backend", BACKEND, "--rdzv-endpoint", store.endpoint,
            "--rdzv-conf", f"rank={rank},timeout={int(join_timeout)}"]  # fmt: skip


def register_handler(status_dir: str | None) -> None:
    """Registers the ``pyinit`` rendezvous backend in torch's registry (in the
    agent, before torchrun's main)."""
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous import RendezvousParameters, registry
    from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import (
        StaticTCPRendezvous,
        create_rdzv_handler,
    )

    class ListeningRendezvous(StaticTCPRendezvous):
        """torch's static rendezvous on the socket pyinit run bound."""

        def get_backend(self) -> str:
            return BACKEND

        def next_rendezvous(self) -> Any:
            if self._store is None:
                descriptor = os.environ.get(FD_ENV)
                serving = self.rank == 0 and descriptor
                listen = {"master_listen_fd": int(descriptor)} if serving else {}
                self._store = TCPStore(self.master_addr, self.master_port, self.world_size,
                                       self.rank == 0, self.timeout, **listen)  # fmt: skip
                if status_dir:
                    Path(status_dir, JOINED_FILE).touch()
            return super().next_rendezvous()

    def create(params: RendezvousParameters) -> ListeningRendezvous:
        params.config["rank"] = int(params.config["rank"])
        static = create_rdzv_handler(params)
        return ListeningRendezvous(static.master_addr, static.master_port, static.rank,
                                   static.world_size, static.run_id,
                                   int(static.timeout.total_seconds()))  # fmt: skip

    registry.handler_registry.register(BACKEND, create)
