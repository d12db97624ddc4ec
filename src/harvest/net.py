"""Network checks on this host: can a server bind this port, is something listening on it, who.

These are checks, never reservations: a socket opened here is closed before the function returns,
and nothing here picks a "free" port for later use (that races with every other process). Every
network call has a timeout. Nothing here signals a process.
"""

from __future__ import annotations

import errno
import socket
from typing import Any

import psutil

def _bind_addresses(host: str, port: int) -> list[tuple[int, tuple[Any, ...]]]:
    """(family, sockaddr) a server binding ``host:port`` would use."""
    if host in ("", "*"):
        host = "0.0.0.0"
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    seen: set[tuple[int, tuple[Any, ...]]] = set()
    out: list[tuple[int, tuple[Any, ...]]] = []
    for family, _type, _proto, _name, sockaddr in infos:
        key = (family, sockaddr[:2])
        if key not in seen:
            seen.add(key)
            out.append((family, sockaddr))
    return out


def port_bindable(host: str, port: int) -> bool:
    """True when a TCP server could bind ``host:port`` now (every address ``host`` resolves to).

    Binds like uvicorn-based engine servers do (SO_REUSEADDR, so a socket in TIME_WAIT does not
    count; never SO_REUSEPORT; "::" dual-stack as
    the OS default) and closes at once. A check, not a reservation.
    """
    try:
        addresses = _bind_addresses(host, port)
    except socket.gaierror:
        return False
    for family, sockaddr in addresses:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(sockaddr)
            except OSError as exc:
                if exc.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
                    return False
                raise
    return True


def _connect_host(host: str) -> str:
    if host in ("", "*", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def port_listening(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when a TCP connection to ``host:port`` succeeds within ``timeout`` seconds."""
    try:
        with socket.create_connection((_connect_host(host), port), timeout=timeout):
            return True
    except OSError:
        return False


def listening_pids(port: int) -> tuple[int, ...]:
    """Pids of processes with a TCP socket listening on ``port`` that this user may see.

    Empty when none is visible (or the OS refuses to say); never a guess.
    """
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return ()
    return tuple(sorted({c.pid for c in conns
                         if c.pid and c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port}))


__all__ = ["listening_pids", "port_bindable", "port_listening"]
