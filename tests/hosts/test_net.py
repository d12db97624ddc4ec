"""Port checks against real sockets the test holds."""

from __future__ import annotations

import os
import socket

import pytest

from harvest.net import listening_pids, port_bindable, port_listening


@pytest.fixture
def listener():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock
    sock.close()


def test_a_listening_port_is_not_bindable_and_is_listening(listener):
    port = listener.getsockname()[1]
    assert port_bindable("127.0.0.1", port) is False
    assert port_bindable("0.0.0.0", port) is False  # the wildcard overlaps 127.0.0.1
    assert port_listening("127.0.0.1", port) is True
    assert port_listening("0.0.0.0", port) is True  # connects to loopback
    assert os.getpid() in listening_pids(port)


def test_a_closed_port_is_bindable_and_not_listening(listener):
    port = listener.getsockname()[1]
    listener.close()
    assert port_bindable("127.0.0.1", port) is True
    assert port_listening("127.0.0.1", port, timeout=0.5) is False
    assert listening_pids(port) == ()


def test_a_port_in_time_wait_counts_as_free_like_for_a_server():
    # A server (SO_REUSEADDR, like uvicorn) closes a connection first, so its end sits in TIME_WAIT
    # on the port. The next server binds with SO_REUSEADDR and can start there; the check must agree.
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port), timeout=5)
    conn, _ = listener.accept()
    conn.close()
    client.close()
    listener.close()
    plain = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:  # shows the TIME_WAIT is there: a bind without SO_REUSEADDR is refused
        with pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))
    finally:
        plain.close()
    assert port_bindable("127.0.0.1", port) is True


def test_a_bound_socket_without_reuseaddr_blocks_the_port():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        assert port_bindable("127.0.0.1", sock.getsockname()[1]) is False
    finally:
        sock.close()


def test_the_check_releases_the_port_at_once(listener):
    port = listener.getsockname()[1]
    listener.close()
    assert port_bindable("127.0.0.1", port)
    # Nothing is left holding it: a real server can bind and listen right after.
    again = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        again.bind(("127.0.0.1", port))
        again.listen()
    finally:
        again.close()


def test_unresolvable_host_is_not_bindable():
    assert port_bindable("no-such-host.invalid", 8000) is False
