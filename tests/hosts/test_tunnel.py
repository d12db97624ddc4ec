"""The data tunnel over a real sshd: bytes reach a loopback-only far listener, and after the ssh
client carrying it is killed the tunnel is reopened on the same local port (the client keeps its
URL) and carries bytes again; close() leaves no client behind."""

from __future__ import annotations

import signal
import socket
import threading
import time

import psutil

from harvest.config import HostConfig
from harvest.placement.ssh.tunnel import Tunnel


def echo_server() -> tuple[socket.socket, int]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                data = conn.recv(1024)
                conn.sendall(b"echo:" + data)

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


def roundtrip(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"ping")
        return s.recv(1024)


def test_tunnel_carries_bytes_and_reopens_on_the_same_port(sshd):
    srv, far_port = echo_server()
    host = HostConfig.model_validate(sshd.host_table(exec_prefix=[]))
    tunnel = Tunnel(host, far_port, reopen_deadline=30)
    try:
        local = tunnel.open()
        assert roundtrip(local) == b"echo:ping"
        first = tunnel.pid
        psutil.Process(first).send_signal(signal.SIGKILL)  # the client harvest started and recorded
        deadline = time.monotonic() + 60
        while (tunnel.reopens < 1 or tunnel.pid == first) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert tunnel.reopens == 1 and tunnel.pid != first and tunnel.local_port == local
        assert roundtrip(local) == b"echo:ping"
    finally:
        last = tunnel.pid
        tunnel.close()
        srv.close()
    assert not psutil.pid_exists(last) or psutil.Process(last).status() == psutil.STATUS_ZOMBIE
