"""Heartbeats between the ranks of a job, so that a rank that dies or stops answering ends it.

A rank that is killed, stopped (SIGSTOP, a frozen node) or cut off leaves the others waiting at
their next collective. Horovod's Gloo controller gives up after its timeout, but Horovod over MPI
(``horovodrun --mpi``, ``mpirun``, ``srun``) waits for ever: MPI has no timeout, and Horovod's
stall inspector runs in the very negotiation that blocks. So every rank keeps a TCP connection
to the chief, beside the collectives, and both ends send a byte every ``interval`` seconds:

* the chief hears nothing from rank k for ``deadline_s``, or k's connection closes without a
  goodbye (k died): the chief ends its process, naming k;
* a rank hears nothing from the chief for ``deadline_s``, or the chief's connection closes
  without a goodbye: that rank ends its process, naming rank 0.

Ending a process ends the job: horovodrun, mpirun and ``srun --kill-on-bad-exit`` stop the
other ranks when one exits with an error. The heartbeats run in a daemon thread, whatever the
training thread is doing (a long checkpoint write or tracing is not silence).

Public symbols: ``Watchdog``, ``EXIT_CODE``.
"""

from __future__ import annotations

import os
import secrets
import selectors
import socket
import sys
import threading
import time
from typing import Any, Callable, Optional

from hvdtrack.errors import TrainingError

EXIT_CODE = TrainingError.exit_code  # like any other "training cannot go on" error
_HELLO, _BEAT, _BYE = b"hello", b".", b"bye"


def _addresses() -> list[str]:
    """This host's IPv4 addresses, loopback last (the other ranks try them in order)."""
    import psutil

    found = [
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family == socket.AF_INET
    ]
    return sorted(set(found), key=lambda a: (a.startswith("127."), a))


class _Peer:
    """One connection: the rank at its other end, when it was last heard, unread bytes."""

    def __init__(self, sock: socket.socket, rank: Optional[int]):
        self.sock, self.rank = sock, rank
        self.heard = time.monotonic()
        self.buffer = b""
        self.said_bye = False
        self.beats = 0  # heartbeats received

    def read(self) -> Optional[list[bytes]]:
        """The complete messages received (None: the connection closed)."""
        try:
            data = self.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError:
            return None
        if not data:
            return None
        self.heard = time.monotonic()
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        return lines

    def send(self, message: bytes) -> None:
        try:
            self.sock.send(message + b"\n")
        except OSError:
            pass  # a full buffer (the peer is stopped) or a closed peer: silence tells the rest


class Watchdog:
    """Heartbeats between this rank and the chief (rank 0) in a daemon thread.

    Args:
      rank, size: this process's rank and the number of ranks.
      deadline_s: the silence after which a rank counts as gone.
      broadcast: sends a picklable object from rank 0 to every rank (a collective every rank
        calls once, at start), e.g. ``hvd.broadcast_object``.
      fail: called with the message when a peer is gone; by default it prints the message and
        ends the process with ``EXIT_CODE``.
    """

    def __init__(
        self,
        rank: int,
        size: int,
        deadline_s: float,
        broadcast: Callable[[Any], Any],
        fail: Optional[Callable[[str], None]] = None,
    ):
        self.rank, self.size, self.deadline_s = rank, size, deadline_s
        self.interval = min(1.0, deadline_s / 10)
        self.fail = fail or _end_process
        self._stop = threading.Event()
        self._selector = selectors.DefaultSelector()
        self._peers: dict[socket.socket, _Peer] = {}
        self._joined: set[int] = set()  # ranks that said hello (the chief's view)
        listener = None
        if rank == 0:
            listener = socket.create_server(("", 0), backlog=size)
            announced = (_addresses(), listener.getsockname()[1], secrets.token_hex(8))
        else:
            announced = None
        self._addresses, self._port, self._token = broadcast(announced)
        if rank == 0:
            listener.setblocking(False)
            self._selector.register(listener, selectors.EVENT_READ)
            self._listener = listener
        else:
            self._listener = None
            self._connect()
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="hvdtrack-watchdog", daemon=True)
        self._thread.start()

    def _connect(self) -> None:
        errors = []
        for address in self._addresses:
            try:
                sock = socket.create_connection((address, self._port), timeout=5)
            except OSError as err:
                errors.append(f"{address}: {err}")
                continue
            sock.sendall(b"%s %s %d\n" % (_HELLO, self._token.encode(), self.rank))
            sock.setblocking(False)
            self._peers[sock] = _Peer(sock, 0)
            self._selector.register(sock, selectors.EVENT_READ)
            return
        raise TrainingError(
            f"rank {self.rank}: cannot reach rank 0's heartbeat port {self._port} at any of its "
            f"addresses ({'; '.join(errors)}). Open the port range between the hosts, or set "
            "distributed.deadline_s: null to run without deadlines"
        )

    def stop(self) -> None:
        """Says goodbye to every peer (this rank is done: its silence is not a failure)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=5)
        for peer in list(self._peers.values()):
            peer.send(_BYE)
            peer.sock.close()
        if self._listener is not None:
            self._listener.close()
        self._selector.close()

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        # Beats go out on the clock, once per interval, never in answer to what arrives: a beat
        # sent on every wake-up made the two ends wake each other at network speed (a third of
        # each rank's core on this machine, 2026-11-27).
        try:
            next_beat = time.monotonic()
            while not self._stop.is_set():
                wait = max(0.0, next_beat - time.monotonic())
                for key, _ in self._selector.select(timeout=wait):
                    if key.fileobj is self._listener:
                        self._accept()
                    else:
                        self._receive(self._peers[key.fileobj])
                if self._stop.is_set():
                    return
                now = time.monotonic()
                if now >= next_beat:
                    for peer in list(self._peers.values()):
                        peer.send(_BEAT)
                    next_beat = now + self.interval
                self._check()
        except Exception as err:  # a bug here must not end training silently
            print(f"hvdtrack: rank {self.rank}: heartbeats stopped ({err!r})", file=sys.stderr)

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except OSError:
            return
        sock.setblocking(False)
        self._peers[sock] = _Peer(sock, None)  # its rank comes with its hello
        self._selector.register(sock, selectors.EVENT_READ)

    def _receive(self, peer: _Peer) -> None:
        messages = peer.read()
        if messages is None:
            self._drop(peer)
            if not peer.said_bye and peer.rank is not None and not self._stop.is_set():
                self._gone(
                    f"rank {peer.rank} ended without finishing (its heartbeat connection "
                    "closed: killed, crashed or its host is gone)"
                )
            return
        for message in messages:
            words = message.split()
            if words[:1] == [_HELLO] and len(words) == 3 and words[1] == self._token.encode():
                peer.rank = int(words[2])
                self._joined.add(peer.rank)
            elif words[:1] == [_HELLO]:
                self._drop(peer)  # not one of this job's ranks
                return
            elif message == _BYE:
                peer.said_bye = True
            elif message == _BEAT:
                peer.beats += 1

    def _drop(self, peer: _Peer) -> None:
        self._selector.unregister(peer.sock)
        del self._peers[peer.sock]
        peer.sock.close()

    def _check(self) -> None:
        now = time.monotonic()
        for peer in self._peers.values():
            if peer.rank is not None and not peer.said_bye and now - peer.heard > self.deadline_s:
                self._gone(
                    f"rank {peer.rank} has not answered for {now - peer.heard:.0f} s (stopped, "
                    "hung, or cut off)"
                )
                return
        if self.rank == 0:
            missing = sorted(set(range(1, self.size)) - self._joined)
            if missing and now - self._started > self.deadline_s:
                self._gone(f"rank {missing[0]} never connected its heartbeat")

    def _gone(self, what: str) -> None:
        self.fail(
            f"rank {self.rank}: {what}; ending this job (distributed.deadline_s: "
            f"{self.deadline_s:g} s). Rerun the same command to resume from the last checkpoint"
        )


def _end_process(message: str) -> None:
    print(f"hvdtrack: error: {message}", file=sys.stderr, flush=True)
    os._exit(EXIT_CODE)
