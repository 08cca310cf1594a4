"""Free TCP ports on 127.0.0.1, never handed out twice by one process."""

from __future__ import annotations

import socket
import threading

__all__ = ["free_port", "port_open"]

_given: set[int] = set()
_lock = threading.Lock()


def free_port() -> int:
    """A loopback port nobody listens on right now and this process has not handed out."""
    with _lock:
        for _ in range(200):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
            if port not in _given:
                _given.add(port)
                return port
    raise OSError("no free loopback port found")


def port_open(port: int, host: str = "127.0.0.1", timeout_s: float = 0.2) -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False
