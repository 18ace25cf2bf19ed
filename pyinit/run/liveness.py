"""The liveness port: a TCP port on each node of a multi-node run (the master
port + 1) that answers while ``pyinit run`` lives, so the other nodes can
tell which node went away, end their own workers when one has, and that
serves this node's stall verdict, so every node names the rank that stalled."""

from __future__ import annotations

import contextlib
import errno
import json
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pyinit.jsonfile import parse_json
from pyinit.run.nodes import Nodes, endpoint, listen_at

PEER_POLL_S = 1.0  # how often a run asks the other nodes how they are
# How long one ask of the poll waits for a node's answer. A slow answer is a miss;
# only LOST_AFTER_S of misses end anything.
PEER_ASK_TIMEOUT_S = 1.0
# A node that does not answer for this long once this node's workers have started
# (every node had joined) is gone: its host died, or its pyinit run was killed, and
# this node's ranks can only wait for its ranks in their next collective (NCCL's own
# timeout is 10 minutes or more). Long enough for a launcher starved of CPU a while.
LOST_AFTER_S = 10.0
# How long one asker may hold the port: answers are sent one at a time. Every answer
# fits the connection's send buffer (see _serve), so only a peer whose kernel takes
# nothing at all would take this long. (sendall's timeout is for the whole answer.)
ANSWER_TIMEOUT_S = 2.0
# What an ask reads of a peer's answer, at most; so a stall verdict is kept within it.
MAX_ANSWER = 1 << 16
JOINED = b"alive joined\n"  # the answer of a node whose agent has reached the rendezvous
# The answer of a node whose run ended well, before it stops answering: its ranks are
# done, and the others may still be at their own end (rank 0's last save).
ENDED = b"ended\n"
# The answers of a node whose run failed, for the moment it stays reachable: its
# silence afterwards ends the others' workers as any node's does, but it ended, and
# is not named gone at their end. "joined" when its agent had reached the
# rendezvous: one that failed before it must still be named as not joined.
ENDED_FAILED = b"ended failed\n"
ENDED_FAILED_JOINED = b"ended failed joined\n"


class Liveness:
    """A TCP port on this node that answers while `pyinit run` lives, so the
    other nodes can tell which node went away when a run fails. It answers
    `alive` (`alive joined` once this node's agent has reached the
    rendezvous), or `stall {json}` once this node's stall watch has found a
    stall (its verdict: the causes and where they were), which the other
    nodes' watchers read, so every node names the rank that stalled; and at
    the run's end, for the moment it stays reachable, `ended` or `ended
    failed` (`ended failed joined`)."""

    def __init__(self, address: str, port: int):
        """Binds the port at `address` ("" for every address) now (so a taken
        one fails before the run starts); it answers once ``start`` runs."""
        self.port = port
        self.stall: bytes | None = None  # this node's stall verdict, once there is one
        # Whether this node's agent has reached the rendezvous (set by its JoinWatch):
        # `alive joined` then, so the node serving the store can name who has not.
        self.joined: Callable[[], bool] = lambda: False
        self._ended = False  # this node's run ended well: it answers ENDED
        self._failed = False  # this node's run failed: it answers ENDED_FAILED(_JOINED)
        self._ended_answers = 0  # how many asks it has answered so since
        self._stop = threading.Event()
        self._seen: dict[int, int] = {}  # the last stall number each node reported
        # Held by the peer watcher from taking a round's answers to handing on their
        # verdicts: all_spoke counts a verdict only once it has been handed on.
        self._handing_on = threading.Lock()
        self._answered_at: dict[int, float] = {}  # when each other node last answered
        self._started_at: float | None = None  # when this node's workers were seen started
        self._ended_peers: set[int] = set()  # the nodes that said their run ended well
        self._failed_peers: set[int] = set()  # the nodes that said their run failed
        self._lost: set[int] = set()  # the nodes found gone (each handed on once)
        try:
            self._sock = listen_at(address, port)
        except OSError as e:
            raise OSError(e.errno, f"cannot listen on {endpoint(address, port)}, this node's "
                          f"liveness port (--master-port + 1): {e.strerror}") from None  # fmt: skip

    def start(self) -> None:
        threading.Thread(target=self._serve, name="pyinit-liveness", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            # Anyone on the network may connect: one that resets the connection (a port
            # scan) ends its own answer, never the port. The answer is left whole in the
            # send buffer, for the kernel to send after the close: one that never reads
            # (however many in a row) must not hold up the next asker.
            with conn, contextlib.suppress(OSError):
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 2 * MAX_ANSWER)
                conn.settimeout(ANSWER_TIMEOUT_S)
                conn.sendall(self._answer())

    def _answer(self) -> bytes:
        if self.stall:
            return self.stall
        if self._ended:
            self._ended_answers += 1
            return ENDED
        if self._failed:
            return ENDED_FAILED_JOINED if self.joined() else ENDED_FAILED
        return JOINED if self.joined() else b"alive\n"

    def report_stall(self, verdict: dict[str, Any]) -> None:
        """Answers `verdict` from now on, within MAX_ANSWER: the causes that do
        not fit (a node of many ranks with long frames) are left out, and
        `causes_left_out` says how many; a peer reading a cut line would
        find no verdict at all."""
        causes = verdict.get("causes", [])
        # Room for everything but the causes (with `causes_left_out` at its largest),
        # then as many causes as fit, each ", " apart.
        room = MAX_ANSWER - len(self._line(dict(verdict, causes=[], causes_left_out=len(causes))))
        kept = 0
        for cause in causes:
            room -= len(json.dumps(cause)) + 2 * (kept > 0)
            if room < 0:
                break
            kept += 1
        shown = dict(verdict, causes=causes[:kept])
        if kept < len(causes):
            shown["causes_left_out"] = len(causes) - kept
        self.stall = self._line(shown)

    @staticmethod
    def _line(verdict: dict[str, Any]) -> bytes:
        return b"stall " + json.dumps(verdict).encode() + b"\n"

    def _ask_peers(self, addresses: Sequence[str], own_rank: int,
                   timeout_s: float) -> dict[int, bytes | None]:  # fmt: skip
        """Every other node's answer on its liveness port (None: no answer),
        all asked at once: within timeout_s however many are silent."""
        peers = {rank: address for rank, address in enumerate(addresses) if rank != own_rank}
        return _ask_all(peers, self.port, timeout_s)

    def new_peer_stalls(self, addresses: Sequence[str], own_rank: int) -> list[dict[str, Any]]:
        """Each other node's stall verdict not seen before (asked once each)."""
        return self._take(self._ask_peers(addresses, own_rank, PEER_ASK_TIMEOUT_S))

    def _take(self, answers: dict[int, bytes | None]) -> list[dict[str, Any]]:
        """Notes who answered what; the stall verdicts not seen before."""
        found, now = [], time.monotonic()
        for rank, line in answers.items():
            if line is None:
                continue
            self._answered_at[rank] = now
            verdict = stall_verdict(line)
            if line == ENDED:
                self._ended_peers.add(rank)
            elif line in (ENDED_FAILED, ENDED_FAILED_JOINED):
                self._failed_peers.add(rank)
            if verdict is not None and verdict["count"] > self._seen.get(rank, 0):
                self._seen[rank] = verdict["count"]
                found.append(verdict)
        return found

    def all_spoke(self, addresses: Sequence[str], own_rank: int) -> bool:
        """Whether every other node has given a stall verdict or said that
        its run ended, as heard by the asks so far."""
        with self._handing_on:
            spoke = set(self._seen) | self._ended_peers | self._failed_peers
        return all(rank in spoke for rank in range(len(addresses)) if rank != own_rank)

    def workers_started(self) -> None:
        """This node's workers run: every node had joined. Before, a node
        that is not there may still come (started again by hand before
        --join-timeout), and only the join watch speaks of it."""
        if self._started_at is None:
            self._started_at = time.monotonic()

    def _newly_lost(self, ranks: Sequence[int]) -> list[tuple[int, float]]:
        """The nodes among `ranks` that have not answered for LOST_AFTER_S
        since this node's workers started, and did not say their run ended
        well, not handed on before; with how long each has been silent."""
        since = self._started_at
        if since is None:
            return []
        now, known, lost = time.monotonic(), self._ended_peers | self._lost, []
        for rank in ranks:
            heard = self._answered_at.get(rank, since)
            if rank not in known and now - max(heard, since) >= LOST_AFTER_S:
                lost.append((rank, now - heard))
        self._lost.update(rank for rank, _ in lost)
        return lost

    def watch_peers(self, addresses: Sequence[str], own_rank: int,
                    on_stall: Callable[[dict[str, Any]], None] | None,
                    on_lost: Callable[[int, float], None]) -> None:  # fmt: skip
        """Asks every other node once a second: hands on each new stall
        verdict (when on_stall is given) and each node found gone (its rank
        and seconds of silence), once."""

        others = [rank for rank in range(len(addresses)) if rank != own_rank]

        def poll() -> None:
            while not self._stop.wait(PEER_POLL_S):
                answers = self._ask_peers(addresses, own_rank, PEER_ASK_TIMEOUT_S)
                with self._handing_on:
                    for verdict in self._take(answers):
                        if on_stall is not None:
                            on_stall(verdict)
                for rank, silent_s in self._newly_lost(others):
                    on_lost(rank, silent_s)

        threading.Thread(target=poll, name="pyinit-peers", daemon=True).start()

    def end_well(self, peers: int, limit_s: float) -> None:
        """Answers ENDED from now on, and waits until as many asks as there
        are other nodes have had that answer (each asks once a second), or
        limit_s: a node that stops answering unannounced is gone to them."""
        self._ended = True
        deadline = time.monotonic() + limit_s
        while self._ended_answers < peers and time.monotonic() < deadline:
            time.sleep(0.05)

    def said_failed(self, rank: int) -> bool:
        """Whether node `rank` was heard saying its run had failed."""
        return rank in self._failed_peers

    def end_failed(self) -> None:
        """Answers ENDED_FAILED (or ENDED_FAILED_JOINED) from now on."""
        self._failed = True

    def unreachable(self, addresses: Sequence[str], own_rank: int) -> list[int]:
        """The other nodes that do not answer within 2 s, but for those that
        said their run had ended: one whose run failed a few seconds before
        this one's has stopped answering, and is not gone."""
        answers = self._ask_peers(addresses, own_rank, 2.0)
        ended = self._ended_peers | self._failed_peers
        return [rank for rank, line in answers.items() if line is None and rank not in ended]

    def close(self) -> None:
        """Stops answering: a node that asks next finds the port refused."""
        self._stop.set()
        # The thread blocked in accept() holds the socket past a close and would
        # answer one more ask (a node gone, or done, taken for alive); a shutdown
        # ends its accept() first.
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


# Peers asked at once, each a descriptor: a node of a large job asks the rest in
# groups of this many, each group within the ask's limit.
ASK_AT_ONCE = 256


def _ask_all(peers: Mapping[int, str], port: int, limit_s: float) -> dict[int, bytes | None]:
    """Each peer's answer (rank: address), its first line (b"" for a port
    that closes at once), or None when none came whole within limit_s: a
    host that is down (no reset, only silence) or a peer (another program on
    that port) sending a byte at a time must not hold up the watch, nor the
    end of the run that asks who is gone, and one silent node must not
    delay the asking of the others."""
    answers: dict[int, bytes | None] = {}
    ranks = list(peers)
    for first in range(0, len(ranks), ASK_AT_ONCE):
        group = {rank: peers[rank] for rank in ranks[first : first + ASK_AT_ONCE]}
        answers.update(_ask_group(group, port, limit_s))
    return answers


def _ask_group(peers: Mapping[int, str], port: int, limit_s: float) -> dict[int, bytes | None]:
    deadline = time.monotonic() + limit_s
    answers: dict[int, bytes | None] = dict.fromkeys(peers)
    received: dict[int, bytes] = {}
    with selectors.DefaultSelector() as selector:
        for rank, address in peers.items():
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            try:
                conn = socket.socket(family, socket.SOCK_STREAM)
            except OSError:
                continue
            conn.setblocking(False)
            try:
                started = conn.connect_ex((address, port)) in (0, errno.EINPROGRESS)
            except OSError:  # an address the kernel cannot take
                started = False
            if not started:  # refused at once, or no route
                conn.close()
                continue
            received[rank] = b""
            selector.register(conn, selectors.EVENT_WRITE, rank)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for key, events in selector.select(left):
                conn, rank = key.fileobj, key.data
                if events & selectors.EVENT_WRITE:  # connected, or failed to
                    if conn.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                        selector.unregister(conn)
                        conn.close()
                    else:
                        selector.modify(conn, selectors.EVENT_READ, rank)
                    continue
                try:
                    chunk = conn.recv(MAX_ANSWER - len(received[rank]))
                except BlockingIOError:
                    continue
                except OSError:  # reset: no answer
                    selector.unregister(conn)
                    conn.close()
                    continue
                received[rank] += chunk
                if chunk and b"\n" not in received[rank] and len(received[rank]) < MAX_ANSWER:
                    continue
                line, newline, _ = received[rank].partition(b"\n")
                answers[rank] = line + newline
                selector.unregister(conn)
                conn.close()
        for key in list(selector.get_map().values()):  # past the limit: no answer
            key.fileobj.close()
    return answers


def stall_verdict(line: bytes | None) -> dict[str, Any] | None:
    """A peer's `stall {json}` answer, or None for anything else: a peer may
    be another program on that port, or cut off mid-line, and its garbage
    must not end this node's watch."""
    if not line or not line.startswith(b"stall "):
        return None
    try:
        verdict = parse_json(line[6:].decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    count = verdict.get("count") if isinstance(verdict, dict) else None
    if not isinstance(count, int) or isinstance(count, bool):
        return None
    return verdict


JOIN_REPORT_S = 5.0  # how often a node that waits for the others says who is missing


class JoinWatch:
    """Until this node's agent has joined the rendezvous (its mark in the
    status folder), says every few seconds which nodes are missing: those
    whose pyinit run does not answer on its liveness port. A thread of its
    own: asking a node that is not there takes a timeout, which the
    supervisor's tick must not wait for. torchrun's rendezvous enforces the
    limit once the agent is in it; at the limit this watch names the missing
    nodes and `expired` tells the supervisor, when this node's agent has not
    even got there (a preload or an import that hangs)."""

    def __init__(self, joined: Path, liveness: Liveness, nodes: Nodes, limit_s: float,
                 say: Callable[[str], None]) -> None:  # fmt: skip
        self.joined, self.liveness, self.limit_s, self.say = joined, liveness, limit_s, say
        self.nodes, self.rank = nodes, nodes.rank
        self.missing_at_limit: list[str] = []  # `missing()` once the limit had passed
        self._done = threading.Event()
        self._expired = threading.Event()
        self._began = time.monotonic()

    def start(self) -> None:
        threading.Thread(target=self._watch, name="pyinit-join", daemon=True).start()

    def stop(self) -> None:
        self._done.set()

    def has_joined(self) -> bool:
        return self.joined.exists()

    def expired(self) -> bool:
        """True once the limit has passed with this node's agent not joined
        (the missing nodes said, and in missing_at_limit)."""
        return self._expired.is_set()

    def not_joined(self) -> tuple[list[int], list[int]]:
        """The nodes that have not joined: those whose pyinit run does not
        answer, and those whose pyinit run answers but whose agent has not
        reached the rendezvous (node 0 serves it: answering, it has joined)."""
        silent, waiting = [], []
        for rank, line in self.liveness._ask_peers(self.nodes.addresses, self.rank, 2.0).items():
            if line is None:
                silent.append(rank)
            elif rank != 0 and line not in (JOINED, ENDED, ENDED_FAILED_JOINED) and (
                    stall_verdict(line) is None):  # fmt: skip
                waiting.append(rank)
        if self.rank != 0 and not self.has_joined():
            waiting.append(self.rank)  # this node's own agent has not either
        return sorted(silent), sorted(waiting)

    def node(self, rank: int) -> str:
        return f"node {rank} ({self.nodes.names[rank]}{', this node' if rank == self.rank else ''})"

    def missing(self) -> list[str]:
        """'node K (NAME)' for each node that has not joined (not_joined)."""
        silent, waiting = self.not_joined()
        return [self.node(rank) for rank in sorted(silent + waiting)]

    def _watch(self) -> None:
        while True:
            left = self.limit_s - (time.monotonic() - self._began)
            if self._done.wait(max(0.0, min(JOIN_REPORT_S, left))) or self.has_joined():
                return
            if time.monotonic() - self._began >= self.limit_s:
                # Said before the supervisor's TERM, whose forwarding pod-init says next.
                self.missing_at_limit = self.missing()
                self.say(f"{named(self.missing_at_limit)} did not join within {self.limit_s:g} s "
                         "(--join-timeout): ending this node's workers")  # fmt: skip
                self._expired.set()
                return
            waited = f"{time.monotonic() - self._began:.0f} s of --join-timeout {self.limit_s:g}"
            silent, waiting = self.not_joined()
            if silent:
                self.say(f"waiting for {', '.join(map(self.node, silent))} to join (no pyinit "
                         f"run answers there): {waited}")  # fmt: skip
            if waiting:
                nodes = ", ".join(map(self.node, waiting))
                self.say(f"waiting for {nodes} to join (its pyinit run answers; its agent has "
                         f"not reached the rendezvous): {waited}")  # fmt: skip
            if not silent and not waiting:
                self.say(f"waiting for the rendezvous (every node has joined): {waited}")


def named(missing: Sequence[str]) -> str:
    """JoinWatch.missing's nodes in a line: "every node" for none named."""
    return ", ".join(missing) if missing else "every node"
