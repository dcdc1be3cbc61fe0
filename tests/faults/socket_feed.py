"""A non-replayable source: a TCP server that hands out each record once.

A client asks ``TAKE n`` and receives up to n JSON lines, then ``END``. Whatever was sent is gone from
the server, whether or not the client lived to process it: like a socket source in the seeds, there is
no offset to rewind to, so a crashed epoch's records cannot be read again.
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading
from collections import deque
from collections.abc import Iterator
from typing import Any

from onceflow.faults import crash_point


class SocketFeed:
    """The server side, run by the harness in a thread; ``address`` is what drivers connect to."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self._queue: deque[dict[str, Any]] = deque(records)
        self._lock = threading.Lock()
        feed = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                line = self.rfile.readline().decode().split()
                count = int(line[1]) if len(line) == 2 and line[0] == "TAKE" else 0
                for record in feed.take(count):
                    self.wfile.write(json.dumps(record).encode() + b"\n")
                self.wfile.write(b"END\n")

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host}:{port}"

    @property
    def remaining(self) -> int:
        with self._lock:
            return len(self._queue)

    def take(self, count: int) -> list[dict[str, Any]]:
        with self._lock:
            return [self._queue.popleft() for _ in range(min(count, len(self._queue)))]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def read_feed(address: str, count: int) -> Iterator[dict[str, Any]]:
    """The client side: up to ``count`` records; crash point ``task_mid_read`` fires halfway."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn, conn.makefile("rwb") as stream:
        stream.write(f"TAKE {count}\n".encode())
        stream.flush()
        for number, line in enumerate(stream):
            if line.strip() == b"END":
                return
            if number == count // 2:
                crash_point("task_mid_read")
            yield json.loads(line)
