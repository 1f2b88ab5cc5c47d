"""A loopback TCP proxy that can cut, stall and reset connections (Kafka or Postgres behind it).

The crash matrix's network faults (F8-F10) and the chaos toolkit's ``pg-cut``, ``pg-stall``,
``kafka-cut`` and ``kafka-stall`` (``spark-eos chaos --faults``) use it; its counters are the proof
that a fault met a connection.

In front of a Postgres that takes TLS, ``postgres_tls=(certificate, key)`` makes the proxy end each client's
TLS with that certificate (the server's own, or another the client's CA signed) and speak TLS to the server:
``reset_on`` sees the SQL a client sends, which TLS hides from a plain relay.
"""

from __future__ import annotations

import select
import socket
import ssl
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ProxyStats", "TcpProxy"]


@dataclass
class ProxyStats:
    """What the proxy did: the proof that a network fault really happened."""

    accepted: int = 0
    refused: int = 0
    resets: int = 0
    pattern_hits: int = 0
    stalled: int = 0  # connections a stall held: open when it began, or accepted while it lasted


def _rst(sock: socket.socket) -> None:
    # SO_LINGER with a zero timeout makes close() send a RST instead of a FIN.
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class _Pair:
    def __init__(self, proxy: TcpProxy, client: socket.socket, upstream: socket.socket) -> None:
        self.proxy, self.client, self.upstream = proxy, client, upstream
        self.closed = False
        self.doomed = False  # pattern seen: drop the server's next answer and reset both sides

    def close(self, reset: bool) -> None:
        if self.closed:
            return
        self.closed = True
        for s in (self.client, self.upstream):
            if reset:
                _rst(s)
            else:
                try:
                    s.close()
                except OSError:
                    pass

    def pump(self) -> None:
        socks = [self.client, self.upstream]
        try:
            while not self.closed:
                if self.proxy.mode == "stall":
                    self.proxy._wake.wait(0.2)
                    continue
                # decrypted bytes a TLS socket already holds are not seen by select()
                ready: list[socket.socket] = [s for s in socks if isinstance(s, ssl.SSLSocket) and s.pending()]
                try:
                    if not ready:
                        ready, _, _ = select.select(socks, [], [], 0.2)
                except (OSError, ValueError):
                    break
                for s in ready:
                    if self.proxy.mode == "stall":
                        break
                    try:
                        data = s.recv(65536)
                    except OSError:
                        data = b""
                    if not data:
                        self.close(reset=False)
                        return
                    if s is self.client:
                        if self.proxy._match(data):
                            self.doomed = True
                        self.upstream.sendall(data)
                    else:
                        if self.doomed:
                            self.proxy.stats.resets += 1
                            self.close(reset=True)
                            return
                        self.client.sendall(data)
        except OSError:
            self.close(reset=False)
        finally:
            self.proxy._forget(self)


_SSL_REQUEST, _GSSENC_REQUEST = 80877103, 80877104  # the Postgres protocol's requests before a startup


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise OSError("the connection closed during the TLS negotiation")
        data += chunk
    return data


def _postgres_tls(
    client: socket.socket, upstream: socket.socket, to_client: ssl.SSLContext, to_server: ssl.SSLContext
) -> tuple[socket.socket, socket.socket]:
    """End the client's TLS here and open TLS to the server (Postgres' SSLRequest on both sides); a client
    that asks no TLS is relayed as it is. A GSSAPI encryption request is declined, as a server without it does."""
    client.settimeout(10)
    while True:
        first = _read(client, 8)
        code = struct.unpack("!ii", first)[1]
        if code != _GSSENC_REQUEST:
            break
        client.sendall(b"N")
    if code != _SSL_REQUEST:
        upstream.sendall(first)  # a plaintext startup: relayed as is
        client.settimeout(None)
        return client, upstream
    upstream.settimeout(10)
    upstream.sendall(first)
    if _read(upstream, 1) != b"S":
        raise OSError("the server declined TLS")
    client.sendall(b"S")
    secured_client = to_client.wrap_socket(client, server_side=True)
    secured_upstream = to_server.wrap_socket(upstream)
    for s in (secured_client, secured_upstream):
        s.settimeout(None)
    return secured_client, secured_upstream


class TcpProxy:
    """Forward 127.0.0.1:``port`` to ``target``; faults: ``cut``, ``stall``, ``reset``, ``reset_on``.

    - ``cut()``: reset every open connection and refuse new ones (accept, then RST) until ``heal()``.
    - ``stall()``: stop forwarding bytes in both directions (connections stay open) until ``heal()``.
    - ``reset()``: reset every open connection once; new connections work.
    - ``reset_on(pattern, times)``: when a client sends bytes containing ``pattern`` (e.g.
      ``b"COMMIT PREPARED"``), forward them, let the server act, then drop its answer and reset the
      connection: the client cannot know whether the command took effect.
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        port: int = 0,
        postgres_tls: Sequence[str | Path] | None = None,
    ) -> None:
        self.target = (target_host, target_port)
        self._tls: tuple[ssl.SSLContext, ssl.SSLContext] | None = None
        if postgres_tls is not None:
            cert, key = postgres_tls
            to_client = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            to_client.load_cert_chain(str(cert), str(key))
            to_server = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            to_server.check_hostname, to_server.verify_mode = False, ssl.CERT_NONE  # a loopback test relay
            self._tls = (to_client, to_server)
        self.mode = "pass"
        self.stats = ProxyStats()
        self._pattern: bytes | None = None
        self._pattern_left = 0
        self._pairs: set[_Pair] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", port))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._stop = False
        self._thread = threading.Thread(target=self._accept_loop, name=f"proxy:{self.port}", daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> TcpProxy:
        self._thread.start()
        return self

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept_loop(self) -> None:
        while not self._stop:
            try:
                ready, _, _ = select.select([self._listener], [], [], 0.2)
                if not ready:
                    continue
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.mode == "cut":
                self.stats.refused += 1
                _rst(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                self.stats.refused += 1
                _rst(client)
                continue
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(client, upstream), daemon=True).start()

    def _serve(self, client: socket.socket, upstream: socket.socket) -> None:
        if self._tls is not None:  # on the connection's own thread: a slow handshake holds up no other
            try:
                client, upstream = _postgres_tls(client, upstream, *self._tls)
            except (OSError, ValueError):
                self.stats.refused += 1
                _rst(client)
                _rst(upstream)
                return
        pair = _Pair(self, client, upstream)
        with self._lock:
            self._pairs.add(pair)
            self.stats.accepted += 1
            if self.mode == "stall":
                self.stats.stalled += 1
        pair.pump()

    def _forget(self, pair: _Pair) -> None:
        with self._lock:
            self._pairs.discard(pair)

    def _match(self, data: bytes) -> bool:
        with self._lock:
            if self._pattern is not None and self._pattern_left > 0 and self._pattern in data:
                self._pattern_left -= 1
                self.stats.pattern_hits += 1
                return True
        return False

    def _reset_all(self) -> int:
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            pair.close(reset=True)
        self.stats.resets += len(pairs)
        return len(pairs)

    def cut(self) -> int:
        """Refuse new connections and reset the open ones; returns how many were reset."""
        self.mode = "cut"
        return self._reset_all()

    def stall(self) -> int:
        """Stop forwarding (connections stay open) until ``heal()``; returns how many open connections it holds."""
        with self._lock:
            self.mode = "stall"
            self._wake.clear()
            held = len(self._pairs)
            self.stats.stalled += held
        return held

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    def reset(self) -> int:
        return self._reset_all()

    def reset_on(self, pattern: bytes, times: int = 1) -> None:
        with self._lock:
            self._pattern, self._pattern_left = pattern, times

    def heal(self) -> None:
        self.mode = "pass"
        self._wake.set()

    def close(self) -> None:
        self._stop = True
        self.heal()
        try:
            self._listener.close()
        except OSError:
            pass
        self._reset_all()
