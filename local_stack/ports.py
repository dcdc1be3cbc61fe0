"""Free loopback ports for the services a test or a bench starts of its own (a cluster, Airflow)."""

from __future__ import annotations

import socket


def free_ports(count: int) -> list[int]:
    """``count`` free loopback ports, held open together so that no two are the same."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def consecutive_free_ports(count: int) -> int:
    """The first of ``count`` consecutive free ports (for services that take the ports after a base)."""
    for _ in range(50):
        first = free_port()
        if first + count > 65535:
            continue
        held: list[socket.socket] = []
        try:
            for port in range(first, first + count):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise AssertionError(f"no {count} consecutive free ports")
