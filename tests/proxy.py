"""A TCP proxy in front of a test redis-server that can lose replies.

``ReplyDropProxy(port)`` listens on a free loopback port and forwards every
connection to ``127.0.0.1:port``. Armed with :meth:`drop_next` (or a drop
probability), it discards the reply Redis sent and closes the client's
connection instead of forwarding it: the command ran on the server, but the
client sees a lost connection and resends, which is what a real network
does to a client at the worst moment. :meth:`lose_requests_to` loses requests
instead, before Redis sees them (the command never runs: a stalled link, a
proxy refusing one client's work). :meth:`cut_all` breaks every open
connection at once (as ``CLIENT KILL`` or a network blip would).

Only for tests and benchmarks; loopback only, bounded by the test's lifetime.
"""

from __future__ import annotations

import random
import select
import socket
import threading
from collections.abc import Callable


class ReplyDropProxy:
    """Forward loopback connections to a redis-server; drop replies on demand."""

    def __init__(self, target_port: int, *, drop_probability: float = 0.0,
                 seed: int | None = None) -> None:
        self.target_port = target_port
        self.drop_probability = drop_probability
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._to_drop = 0
        self._markers: list[bytes] = []
        #: marker -> requests still to lose before they reach Redis (:meth:`lose_requests_to`)
        self._losing: dict[bytes, int] = {}
        #: requests lost so far (each closed its client's connection)
        self.lost = 0
        #: replies discarded so far (each closed its client's connection)
        self.dropped = 0
        #: connections accepted so far
        self.connections = 0
        #: called with the client's request bytes just before a reply is dropped
        self.on_drop: Callable[[bytes], None] | None = None
        self._socks: set[socket.socket] = set()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="reply-drop-proxy",
                                        daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def drop_next(self, n: int = 1) -> None:
        """Lose the next ``n`` replies (of any connection)."""
        with self._lock:
            self._to_drop += n

    def drop_reply_to(self, marker: bytes, n: int = 1) -> None:
        """Lose the replies to the next ``n`` requests whose bytes contain ``marker``
        (e.g. a script's SHA1), whatever other traffic passes in between (a reconnecting
        client's handshake, other commands)."""
        with self._lock:
            self._markers.extend([marker] * n)

    def lose_requests_to(self, marker: bytes, n: int = 1) -> None:
        """Lose the next ``n`` requests whose bytes contain ``marker`` before Redis sees
        them: the connection is closed instead (the client sees a lost connection and
        resends). A request is checked as its bytes arrive, so keep it short (one read
        of the client's socket) for nothing of it to run."""
        with self._lock:
            self._losing[marker] = self._losing.get(marker, 0) + n

    def stop_losing(self) -> None:
        """Forget the requests :meth:`lose_requests_to` still had to lose."""
        with self._lock:
            self._losing.clear()

    def _should_lose(self, request: bytearray) -> bool:
        with self._lock:
            for marker, left in self._losing.items():
                if marker in request:
                    if left > 1:
                        self._losing[marker] = left - 1
                    else:
                        del self._losing[marker]
                    self.lost += 1
                    return True
        return False

    def armed(self, marker: bytes) -> bool:
        """Whether a :meth:`drop_reply_to` of ``marker`` still waits for its request."""
        with self._lock:
            return marker in self._markers

    def disarm(self, marker: bytes) -> None:
        """Forget a :meth:`drop_reply_to` of ``marker`` that is still waiting."""
        with self._lock:
            if marker in self._markers:
                self._markers.remove(marker)

    def pending_drops(self) -> int:
        with self._lock:
            return self._to_drop + len(self._markers)

    def cut_all(self) -> int:
        """Close every open connection (both sides); return how many pairs."""
        with self._lock:
            socks = list(self._socks)
        for s in socks:
            _close(s)
        return len(socks) // 2

    def close(self) -> None:
        self._closed.set()
        _close(self._listener)
        self.cut_all()
        self._thread.join(2)

    def __enter__(self) -> ReplyDropProxy:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------

    def _should_drop(self, request: bytearray) -> bool:
        with self._lock:
            for n, marker in enumerate(self._markers):
                if marker in request:
                    del self._markers[n]
                    self.dropped += 1
                    return True
            if self._to_drop > 0:
                self._to_drop -= 1
                self.dropped += 1
                return True
            if self.drop_probability and self._rng.random() < self.drop_probability:
                self.dropped += 1
                return True
        return False

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self.connections += 1
                self._socks.update((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True,
                             name="reply-drop-pump").start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        request = bytearray()  # what the client sent since the last reply it was given
        try:
            while not self._closed.is_set():
                readable, _, _ = select.select([client, upstream], [], [], 0.5)
                for s in readable:
                    data = s.recv(65536)
                    if not data:
                        return
                    if s is client:
                        request += data
                        if self._should_lose(request):
                            return  # never forwarded: lost with the connection
                        upstream.sendall(data)
                    elif self._should_drop(request):
                        if self.on_drop is not None:
                            self.on_drop(bytes(request))
                        return  # the reply is lost with the connection
                    else:
                        request.clear()
                        client.sendall(data)
        except (OSError, ValueError):  # ValueError: select() on a socket cut_all() closed
            return
        finally:
            with self._lock:
                self._socks.discard(client)
                self._socks.discard(upstream)
            _close(client)
            _close(upstream)


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass
