"""A loopback TCP proxy that can stop relaying without closing anything: a database behind it then
accepts connections and bytes but never answers, as a stopped (SIGSTOP) or partitioned server does."""

from __future__ import annotations

import contextlib
import socket
import threading

from api.serve.embedded import free_port


class FreezableProxy:
    def __init__(self, *, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = free_port()
        self._relaying = threading.Event()
        self._relaying.set()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.settimeout(0.2)
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze(self) -> None:
        self._relaying.clear()

    def thaw(self) -> None:
        self._relaying.set()

    def close(self) -> None:
        self._closed.set()
        self._relaying.set()
        self._listener.close()
        for sock in list(self._sockets):
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            self._sockets += [client, server]
            for source, target in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, target), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while True:
                # Frozen: bytes wait in the kernel's buffers, unread and unanswered.
                self._relaying.wait()
                data = source.recv(65536)
                if not data or self._closed.is_set():
                    break
                self._relaying.wait()
                target.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
