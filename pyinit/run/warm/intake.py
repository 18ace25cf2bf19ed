"""The warm interpreter's reading of requests: every connected peer is read
as its bytes come, in the one select loop, so a peer that connects and says
nothing (or says it slowly) holds up nobody else. A request is data from a
peer that may be hostile even when it is this user's: whatever is wrong with
it (its framing, its JSON, its deadline, too many peers at once) ends that
connection with one line in ``warm.log``, and the loop goes on.

No threads: the warm interpreter forks, and a fork must find none.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pyinit.run.warm import protocol

REQUEST_DEADLINE_S = 10.0  # from the connection to its whole request
MAX_PENDING = 256  # peers being read at once; past it, the oldest is dropped
MAX_BUFFERED = 64 << 20  # bytes of unfinished requests held, all peers together
REPLY_TIMEOUT_S = 5.0  # for an answer the peer does not read


@dataclass
class Pending:
    """One peer's request as far as it has come."""

    conn: socket.socket
    deadline: float  # time.monotonic()
    data: bytearray = field(default_factory=bytearray)
    fds: list[int] = field(default_factory=list)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()
        self.conn.close()


class Intake:
    """The requests being read. `say` writes the one line of a refusal."""

    def __init__(self, say: Callable[[str], None]):
        self.say = say
        self.pending: dict[int, Pending] = {}  # by the connection's fd

    def add(self, conn: socket.socket) -> None:
        if len(self.pending) >= MAX_PENDING:
            self.add_room()
        conn.setblocking(False)
        self.pending[conn.fileno()] = Pending(conn, time.monotonic() + REQUEST_DEADLINE_S)

    def add_room(self) -> None:
        """The oldest peer dropped, for a newer one."""
        oldest = min(self.pending.values(), key=lambda p: p.deadline)
        self._drop(oldest, f"{len(self.pending)} peers at once: the oldest was dropped")

    def fds(self) -> list[int]:
        return list(self.pending)

    def timeout(self) -> float | None:
        """Seconds until the nearest deadline; None when nothing is pending."""
        if not self.pending:
            return None
        nearest = min(p.deadline for p in self.pending.values())
        return max(0.0, nearest - time.monotonic())

    def read(self, ready: set[int]) -> Iterator[tuple[socket.socket, dict[str, Any], list[int]]]:
        """Each request now whole, with its connection (blocking again, with
        a timeout for the answer) and descriptors, which become the caller's
        to close; peers past their deadline, gone or malformed are dropped."""
        now = time.monotonic()
        for fd, pending in list(self.pending.items()):
            if fd in ready:
                try:
                    request = self._take(pending)
                except EOFError as error:  # a probe that only connects is no news
                    self._drop(pending, "" if not pending.data else str(error))
                    continue
                except Exception as error:  # a peer's bytes: anything may be wrong
                    self._drop(pending, f"a request that could not be read: {_said(error)}")
                    continue
                if request is not None:
                    del self.pending[fd]
                    pending.conn.setblocking(True)
                    pending.conn.settimeout(REPLY_TIMEOUT_S)
                    yield pending.conn, request, pending.fds
                    continue
            if fd in self.pending and now >= pending.deadline:
                got = len(pending.data)
                self._drop(pending, f"a peer sent {got} bytes and no whole request in "
                                    f"{REQUEST_DEADLINE_S:g} s")  # fmt: skip

    def _take(self, pending: Pending) -> dict[str, Any] | None:
        """The request once all of it has come; None while it is coming.
        EOFError when the peer closed first."""
        room = protocol.MAX_FDS - len(pending.fds)
        try:
            if room > 0:
                chunk, fds, _flags, _addr = socket.recv_fds(pending.conn, 1 << 16, room)
                pending.fds.extend(fds)
            else:
                chunk = pending.conn.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return None
        if not chunk:
            raise EOFError("a request was cut short")
        pending.data += chunk
        if sum(len(p.data) for p in self.pending.values()) > MAX_BUFFERED:
            raise ValueError(f"peers held more than {MAX_BUFFERED >> 20} MiB of unfinished "
                             "requests")  # fmt: skip
        if len(pending.data) < protocol.HEADER.size:
            return None
        end = protocol.HEADER.size + protocol.body_length(pending.data)
        if len(pending.data) < end:
            return None
        return protocol.decode(pending.data[protocol.HEADER.size : end])

    def _drop(self, pending: Pending, why: str) -> None:
        if why:
            self.say(why)
        del self.pending[pending.conn.fileno()]
        pending.close()

    def close(self) -> None:
        """Every pending peer's connection and descriptors closed (in a fork
        of the warm interpreter: its copies only)."""
        for pending in self.pending.values():
            with contextlib.suppress(OSError):
                pending.close()
        self.pending.clear()


def _said(error: BaseException) -> str:
    if isinstance(error, OSError):
        return error.strerror or str(error)
    return str(error) if isinstance(error, ValueError) else f"{type(error).__name__}: {error}"
