"""A TCP relay standing in for a load balancer: it connects to the broker and writes a PROXY header
of the test's choosing (any client address) before relaying the client's bytes both ways."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

Header = Callable[[tuple[str, int]], bytes]  # client's (host, port) -> the header to send first


class Relay:
    def __init__(self, target: tuple[str, int], header: Header) -> None:
        self.target = target
        self.header = header
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._closed = False
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, address = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target, timeout=10)
            upstream.settimeout(None)
            self._sockets += [client, upstream]
            upstream.sendall(self.header(address))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        for sock in self._sockets:
            sock.close()
