"""AiohttpTransport against a real HTTP/1.1 server on loopback that hangs up on kept-alive connections,
and the request head its wire writes.

The server is a raw asyncio TCP server (a test fixture), so the test decides exactly which request
on which connection is closed unanswered: the race of a kept-alive connection the server closes as
the client reuses it, which made a vLLM endpoint "sick" at 128+ requests in flight.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from harvest.aiohttp_transport import AiohttpTransport
from harvest.transport import Interrupted, TimedOut, Unreachable

_OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n{\"ok\": true}"


@dataclass
class _Server:
    """Answers request k (0-based, counted per connection) unless ``hang_up(conn, k)`` says close."""

    hang_up: Callable[[int, int], bool]
    requests: list[tuple[int, int]] = field(default_factory=list)
    heads: list[bytes] = field(default_factory=list)  # each request's head, as written
    before: bytes = b""  # written ahead of each answer (an informational 1xx)
    connections: int = 0
    port: int = 0
    listener: asyncio.AbstractServer | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn, self.connections = self.connections, self.connections + 1
        k = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                self.requests.append((conn, k))
                self.heads.append(head)
                if self.hang_up(conn, k):
                    return  # close without a byte of answer
                writer.write(self.before + _OK)
                await writer.drain()
                k += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Callable[[int, int], bool]], Awaitable[_Server]]]:
    """Start a server on a free loopback port; all of them are closed at the end of the test."""
    made: list[asyncio.AbstractServer] = []

    async def start(hang_up: Callable[[int, int], bool]) -> _Server:
        state = _Server(hang_up)
        server = await asyncio.start_server(state.handle, "127.0.0.1", 0)
        state.port, state.listener = server.sockets[0].getsockname()[1], server
        made.append(server)
        return state

    yield start
    for server in made:
        server.close()
        await server.wait_closed()


async def test_a_kept_alive_connection_closed_unanswered_is_tried_once_more_on_a_new_one(serve):
    # The second request of every connection is hung up on: the race of a kept-alive connection.
    server = await serve(lambda conn, k: k == 1)
    transport = AiohttpTransport(max_connections=4)
    try:
        url = f"http://127.0.0.1:{server.port}/v1/chat/completions"
        first = await transport.request("POST", url, body=b"{}", timeout=10)
        second = await transport.request("POST", url, body=b"{}", timeout=10)  # reuses the connection
    finally:
        await transport.aclose()
    assert first.status == second.status == 200 and second.body == b'{"ok": true}'
    # The hung-up request, then the same request again on a second connection.
    assert server.requests == [(0, 0), (0, 1), (1, 0)]


async def test_a_server_that_hangs_up_twice_is_interrupted_after_one_more_try(serve):
    server = await serve(lambda conn, k: True)
    transport = AiohttpTransport(max_connections=4)
    try:
        with pytest.raises(Interrupted, match="ServerDisconnectedError") as caught:
            await transport.request("POST", f"http://127.0.0.1:{server.port}/x", body=b"{}", timeout=10)
    finally:
        await transport.aclose()
    assert caught.value.closed_unanswered
    assert len(server.requests) == 2  # one more try, not a loop


async def test_a_server_that_died_under_the_request_reads_as_interrupted_not_unreachable(serve):
    # It hangs up and stops listening at once (a crash): the second try is refused, and what the
    # client sees is the first failure, so a request that may have killed a server is counted as such.
    server = await serve(lambda conn, k: True)

    def hang_up_and_die(conn: int, k: int) -> bool:
        server.listener.close()
        return True

    server.hang_up = hang_up_and_die
    transport = AiohttpTransport(max_connections=4)
    try:
        with pytest.raises(Interrupted) as caught:
            await transport.request("POST", f"http://127.0.0.1:{server.port}/x", body=b"{}", timeout=10)
    finally:
        await transport.aclose()
    assert not isinstance(caught.value, Unreachable) and caught.value.closed_unanswered
    assert server.requests == [(0, 0)]


async def test_a_request_that_times_out_is_not_tried_again(serve):
    hung = asyncio.Event()

    async def never(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        hung.set()
        await asyncio.sleep(30)

    listener = await asyncio.start_server(never, "127.0.0.1", 0)
    transport = AiohttpTransport(max_connections=4)
    try:
        with pytest.raises(TimedOut):
            await transport.request("POST", f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}/x",
                                    body=b"{}", timeout=0.5)
    finally:
        await transport.aclose()
        listener.close()
    assert hung.is_set()


async def test_the_second_try_takes_a_new_connection_not_another_pooled_one(serve):
    # Two pooled connections, both stale: a client that read its answers late reuses every one late.
    server = await serve(lambda conn, k: k == 1)
    transport = AiohttpTransport(max_connections=4)
    url = f"http://127.0.0.1:{server.port}/x"
    try:
        await asyncio.gather(*(transport.request("POST", url, body=b"{}", timeout=10) for _ in range(2)))
        assert server.connections == 2
        answer = await transport.request("POST", url, body=b"{}", timeout=10)
    finally:
        await transport.aclose()
    assert answer.status == 200
    assert server.connections == 3 and server.requests[-1] == (2, 0), server.requests


async def test_a_request_written_into_a_connection_the_server_closed_is_sent_again_on_a_new_one():
    """The kept-alive race met while the request is being written: the server closes an idle
    connection (a FIN) while the client's loop is busy elsewhere, so the client still takes it for
    open, reuses it, and its write breaks (a broken pipe for a long prompt). The request was not
    answered: it goes once more on a new connection instead of counting against the endpoint."""
    connections: list[int] = []
    ready = threading.Event()
    stop = threading.Event()
    where: dict[str, int] = {}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections))
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            await reader.readexactly(length)
            writer.write(_OK)
            await writer.drain()
            await asyncio.sleep(0.05)  # then its keep-alive ends: one request per connection
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def serve_in_a_thread() -> None:  # its own loop: it closes while the client's loop is blocked
        async def run() -> None:
            listener = await asyncio.start_server(handle, "127.0.0.1", 0)
            where["port"] = listener.sockets[0].getsockname()[1]
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.02)
            listener.close()
            await listener.wait_closed()

        asyncio.run(run())

    thread = threading.Thread(target=serve_in_a_thread, daemon=True)
    thread.start()
    assert ready.wait(10)
    transport = AiohttpTransport(max_connections=4)
    url = f"http://127.0.0.1:{where['port']}/v1/chat/completions"
    body = b'{"prompt": "' + b"x" * (4 << 20) + b'"}'  # a long prompt: written after the headers
    try:
        first = await transport.request("POST", url, body=body, timeout=20)
        time.sleep(0.3)  # a loop starved of CPU: the server's close arrives and is not read yet
        second = await transport.request("POST", url, body=body, timeout=20)
        fresh = transport._fresh  # noqa: SLF001 - made only for a second try
    finally:
        await transport.aclose()
        stop.set()
        thread.join(10)
    assert first.status == second.status == 200 and second.body == b'{"ok": true}'
    # The closed connection was reused (its write broke, no request reached the server), then the
    # same request went on a connection of its own: the transport's one-use session for retries.
    assert connections == [0, 1] and fresh is not None


async def test_timed_events_count_only_events_that_carry_text():
    """A role-only chunk sent before any token (and a usage chunk after the last) would read as a
    first token that never waited: only events with generated text are timed."""
    from harvest.transport import MockTransport, RawResponse

    stream = (b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
              b'data: {"choices":[{"delta":{"content":"one"}}]}\n\n'
              b'data: {"choices":[{"text":" two"}]}\n\n'
              b'data: {"choices":[],"usage":{"completion_tokens":2}}\n\n'
              b'data: [DONE]\n\n')
    events = await MockTransport(lambda *_: RawResponse(200, stream)).timed_events("http://e/x", body=b"{}", timeout=5)
    assert events.status == 200 and len(events.arrivals) == 2


async def test_a_request_cut_by_the_transports_close_opens_no_new_session():
    """The client closing (Ctrl-C while generating) cuts its requests on the wire; one of them read
    as hung up on must not open a fresh session after the close: it would be left unclosed
    ("Unclosed client session" at exit)."""
    import gc
    import warnings

    got = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            got.set()
            await asyncio.sleep(30)  # never answers: the close comes first
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        transport = AiohttpTransport(max_connections=2)
        request = asyncio.ensure_future(transport.request("POST", f"http://127.0.0.1:{port}/x", body=b"{}",
                                                          timeout=20))
        await asyncio.wait_for(got.wait(), 10)
        await transport.aclose()
        with pytest.raises(Exception):
            await asyncio.wait_for(request, 20)
        server.close()
        await server.wait_closed()
        del transport, request
        gc.collect()
        await asyncio.sleep(0)
    leaked = [str(w.message) for w in seen if "Unclosed client session" in str(w.message)]
    assert not leaked, leaked


async def test_the_request_head_carries_the_callers_headers_once_and_a_100_continue_is_skipped(serve):
    """The head the wire writes: the caller's headers replace the defaults whatever their case,
    the body's length and the host with its port; credentials in the URL go as Basic auth; an
    informational 100 before the answer is read past; one connection serves requests in turn."""
    server = await serve(lambda conn, k: False)
    server.before = b"HTTP/1.1 100 Continue\r\n\r\n"
    port = server.port
    transport = AiohttpTransport(max_connections=2)
    try:
        posted = await transport.request("POST", f"http://127.0.0.1:{port}/v1/chat/completions?x=1", body=b"{}",
                                         headers={"user-agent": "harvest-test", "Content-Type": "application/json"},
                                         timeout=10)
        got = await transport.request("GET", f"http://user:secret@127.0.0.1:{port}/health", timeout=10)
    finally:
        await transport.aclose()
    assert posted.status == got.status == 200 and posted.body == got.body == b'{"ok": true}'
    lines = server.heads[0].decode().split("\r\n")
    assert lines[0] == "POST /v1/chat/completions?x=1 HTTP/1.1"
    fields = [line.split(": ", 1) for line in lines[1:] if line]
    names = [name.lower() for name, _ in fields]
    assert len(names) == len(set(names)), names
    sent = {name.lower(): value for name, value in fields}
    assert {"host": f"127.0.0.1:{port}", "user-agent": "harvest-test", "content-type": "application/json",
            "content-length": "2"}.items() <= sent.items(), sent
    second = server.heads[1].decode().split("\r\n")
    assert second[0] == "GET /health HTTP/1.1" and "Authorization: Basic dXNlcjpzZWNyZXQ=" in second
    assert server.requests == [(0, 0), (0, 1)]  # the second request reused the first one's connection


async def test_requests_over_the_pools_limit_wait_for_a_connection(serve):
    server = await serve(lambda conn, k: False)
    transport = AiohttpTransport(max_connections=2)
    url = f"http://127.0.0.1:{server.port}/x"
    try:
        answers = await asyncio.gather(*(transport.request("POST", url, body=b"{}", timeout=10) for _ in range(12)))
    finally:
        await transport.aclose()
    assert [a.status for a in answers] == [200] * 12 and len(server.requests) == 12
    assert server.connections == 2, server.connections


#: The client side of the TLS test, in a fresh interpreter: aiohttp makes its verifying context when
#: it is imported, from OpenSSL's defaults, which SSL_CERT_FILE names (the test's own certificate).
TLS_CLIENT = """
import asyncio, json, sys
from harvest.aiohttp_transport import AiohttpTransport
from harvest.transport import TransportError

async def main():
    transport = AiohttpTransport(max_connections=2)
    try:
        answers = [await transport.request("POST", sys.argv[1], body=b"{}", timeout=10) for _ in range(2)]
        print(json.dumps({"status": [a.status for a in answers], "body": answers[0].body.decode()}))
    except TransportError as exc:
        print(json.dumps({"error": type(exc).__name__, "text": str(exc)}))
    finally:
        await transport.aclose()

asyncio.run(main())
"""


def test_an_https_endpoint_is_spoken_to_over_tls_its_certificate_verified():
    """A TLS server on loopback with the test's self-signed certificate (tests/data/tls, for
    127.0.0.1, valid from 2000 to 2126: whatever a machine's clock reads): trusted, two requests
    are answered over one verified connection; not trusted, the request fails as unreachable and
    names the certificate."""
    import json
    import os
    import ssl
    import subprocess
    import sys
    from pathlib import Path

    tls = Path(__file__).resolve().parent / "data" / "tls"
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls / "cert.pem", tls / "key.pem")
    ready, where, stop = threading.Event(), {}, threading.Event()
    handshakes: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handshakes.append(1)
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(2)
                writer.write(_OK)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    def serve() -> None:
        async def run() -> None:
            listener = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=context)
            where["port"] = listener.sockets[0].getsockname()[1]
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.02)
            listener.close()

        asyncio.run(run())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    url = f"https://127.0.0.1:{where['port']}/v1/chat/completions"
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    try:
        runs = [subprocess.run([sys.executable, "-c", TLS_CLIENT, url], capture_output=True, text=True, timeout=60,
                               env={**env, **extra}, cwd=root)
                for extra in ({"SSL_CERT_FILE": str(tls / "cert.pem")}, {"SSL_CERT_FILE": os.devnull})]
    finally:
        stop.set()
        thread.join(10)
    trusted, untrusted = (json.loads(run.stdout.strip().splitlines()[-1]) for run in runs)
    assert trusted == {"status": [200, 200], "body": '{"ok": true}'}, runs[0].stderr[-2000:]
    assert untrusted["error"] == "Unreachable" and "certificate" in untrusted["text"].lower(), untrusted
    # One connection served both trusted requests; the untrusted client's handshake never completed.
    assert len(handshakes) == 1


@pytest.mark.parametrize("url", ["ftp://127.0.0.1:1/x?api_key=SECRET", "http:///x?api_key=SECRET",
                                 "http://127.0.0.1:notaport/x?api_key=SECRET"])
async def test_a_url_http_cannot_reach_is_unreachable_and_not_quoted(url):
    transport = AiohttpTransport(max_connections=1)
    try:
        with pytest.raises(Unreachable) as caught:
            await transport.request("GET", url, timeout=5)
    finally:
        await transport.aclose()
    assert "SECRET" not in str(caught.value), caught.value
