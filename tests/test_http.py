"""harvest.http: blocking requests on aiohttp, against a real server on loopback.

The server here is the standard library's ``http.server`` in a thread: a test fixture, not a second
HTTP library in harvest.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from harvest import http
from harvest.transport import MockTransport, RawResponse, TimedOut, Unreachable
from tests.engines import not_http_peer


class _Handler(BaseHTTPRequestHandler):
    release: threading.Event
    seen: list[tuple[str, str, str | None, bytes]]

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.seen.append(("GET", self.path, self.headers.get("Authorization"), b""))
        if self.path == "/slow":
            self.release.wait(60)
        self._answer(500 if self.path == "/broken" else 200, b'{"ok": true}')

    def do_POST(self) -> None:
        data = self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append(("POST", self.path, self.headers.get("Content-Type"), data))
        self._answer(201, data)


@pytest.fixture
def server() -> Iterator[tuple[str, type[_Handler]]]:
    handler = type("H", (_Handler,), {"release": threading.Event(), "seen": []})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", handler
    finally:
        handler.release.set()
        srv.shutdown()
        srv.server_close()
        thread.join(10)


def _refused_port() -> tuple[socket.socket, int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    return sock, sock.getsockname()[1]


def test_get_and_post_on_loopback(server):
    url, handler = server
    with http.SyncHttp() as client:
        r = client.get(url + "/health", timeout=10, headers={"Authorization": "Bearer k"})
        assert r.status == 200 and r.ok and r.json() == {"ok": True}
        r = client.post(url + "/echo", json={"a": [1, 2]}, timeout=10)
        assert r.status == 201 and json.loads(r.text) == {"a": [1, 2]}
        broken = client.get(url + "/broken", timeout=10)  # a status is an answer, not an error
        assert broken.status == 500 and not broken.ok
    assert handler.seen[0] == ("GET", "/health", "Bearer k", b"")
    assert handler.seen[1] == ("POST", "/echo", "application/json", b'{"a": [1, 2]}')


def test_one_shot_helpers(server):
    url, _ = server
    assert http.get(url + "/x", timeout=10).json() == {"ok": True}
    assert http.post(url + "/y", json=[3], timeout=10).json() == [3]


def test_a_refused_connection_is_an_http_error_caused_by_unreachable():
    sock, port = _refused_port()
    with sock, pytest.raises(http.HttpError) as info:
        http.get(f"http://127.0.0.1:{port}/health", timeout=5)
    assert isinstance(info.value.__cause__, Unreachable)
    assert f"GET http://127.0.0.1:{port}/health" in str(info.value)


def test_a_server_that_does_not_answer_times_out(server):
    url, handler = server
    t0 = time.monotonic()
    with pytest.raises(http.HttpError) as info:
        http.get(url + "/slow", timeout=0.5)
    assert isinstance(info.value.__cause__, TimedOut)
    assert time.monotonic() - t0 < 30  # bounded (the server would hold it 60 s)


def test_an_environment_proxy_is_never_used(server, monkeypatch):
    sock, port = _refused_port()
    with sock:
        for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.setenv(name, f"http://127.0.0.1:{port}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        url, handler = server
        assert http.get(url + "/direct", timeout=10).status == 200
    assert handler.seen[-1][1] == "/direct"


def test_usable_from_inside_a_running_event_loop(server):
    url, _ = server

    async def main() -> int:
        with http.SyncHttp() as client:
            return client.get(url + "/in-loop", timeout=10).status

    assert asyncio.run(main()) == 200


def test_close_stops_the_private_loop_and_is_idempotent(server):
    url, _ = server
    client = http.SyncHttp()
    client.get(url + "/a", timeout=10)
    client.close()
    client.close()
    assert not client._thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        client.get(url + "/b", timeout=10)


def test_a_mock_transport_replaces_the_network():
    asked = []

    def handler(method, url, body, headers):
        asked.append((method, url, body, headers.get("Content-Type")))
        return RawResponse(404, b"no")

    with http.SyncHttp(transport=MockTransport(handler)) as client:
        r = client.post("http://nowhere:1/p", json={"k": 1}, timeout=1)
    assert r.status == 404 and r.text == "no"
    assert asked == [("POST", "http://nowhere:1/p", b'{"k": 1}', "application/json")]


def test_an_answer_that_is_not_http_is_an_http_error():
    """A peer that writes garbage: an error of this module, not aiohttp's own exception."""
    with not_http_peer() as port, pytest.raises(http.HttpError) as info:
        http.get(f"http://127.0.0.1:{port}/x", timeout=10)
    assert info.value.__cause__ is not None
