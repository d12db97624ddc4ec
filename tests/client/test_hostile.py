"""The client against endpoints that answer /health and /v1/models well and completions badly
(``bench/hostile_server.py``, a raw asyncio server in the test's loop): every answer has an outcome
of its own class, never an exception of aiohttp's, and what a huge answer costs the client is
bounded by its cap, not by what the server sends."""

from __future__ import annotations

import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from bench.hostile_server import HostileServer
from harvest.client import Client, RetryPolicy
from harvest.client.startcheck import StartCheck
from harvest.config import ClientConfig, SamplingConfig
from harvest.errors import RequestError

MAX_TOKENS = 64
#: Bytes a test's huge answer has (the caps are ~260 KiB at 64 tokens): far more than a client
#: that read it would hold, little for a server that is stopped early.
HUGE = 256 << 20
Start = Callable[..., Awaitable[HostileServer]]


@pytest.fixture
async def hostile() -> AsyncIterator[Start]:
    servers: list[HostileServer] = []

    async def start(case: str, **kwargs: object) -> HostileServer:
        server = HostileServer(case, **kwargs)  # type: ignore[arg-type]
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.close()


def client(url: str, *, stream: bool = False, retries: int = 1) -> Client:
    config = ClientConfig(concurrency=2, max_retries=retries, request_timeout=30, stream=stream)
    return Client([url], config, SamplingConfig(max_tokens=MAX_TOKENS), model="hostile-model",
                  retry=RetryPolicy(backoff_base=0.01, backoff_cap=0.02, probe_timeout=5))


async def failure(server: HostileServer, *, stream: bool = False) -> RequestError:
    async with client(server.url, stream=stream) as c:
        with pytest.raises(RequestError) as caught:
            await c.chat([{"role": "user", "content": "hi"}])
    return caught.value


@pytest.mark.parametrize("case, size, stream", [
    ("gzip_bomb", 32 << 20, False),     # 32 MiB once inflated, ~32 KB on the wire
    ("big_body", HUGE, False),          # announced by Content-Length: refused from the head
    ("big_string", HUGE, False),        # chunked, no length: counted while read
    ("sse_long_line", HUGE, True),      # one streamed line that never ends
])
async def test_a_huge_answer_fails_as_oversized_and_costs_the_client_its_cap(hostile, case, size, stream):
    server = await hostile(case, size=size)
    tracemalloc.start()
    try:
        exc = await failure(server, stream=stream)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert exc.error_class == "oversized", exc
    assert "reply_bytes_per_token" in str(exc) and "gave up after 2 attempts" in str(exc)
    assert server.requests == 2  # retried once, as any failed attempt
    # What the client allocated while it read two of them: its cap, not the answer (a client that
    # kept the answer would pass 256 MiB here).
    assert peak < 24 << 20, f"{peak:,} bytes allocated"
    if case != "gzip_bomb":
        assert server.sent < 96 << 20, f"the server could send {server.sent:,} bytes: the client kept reading"


@pytest.mark.parametrize("case", ["bad_status", "many_headers", "big_header", "bad_chunk", "dup_length", "banner"])
async def test_a_malformed_answer_fails_as_protocol_naming_what_came(hostile, case):
    server = await hostile(case)
    exc = await failure(server)
    assert exc.error_class == "protocol" and exc.status is None, exc
    said = {"bad_status": "Bad status line", "many_headers": "Too many headers", "big_header": "8190 bytes",
            "bad_chunk": "chunk size", "dup_length": "Duplicate Content-Length",
            "banner": "SSH-2.0-OpenSSH"}[case]
    assert said in str(exc) and "\x1b" not in str(exc), exc


async def test_an_endless_stream_is_cut_at_max_tokens_and_truncated(hostile):
    server = await hostile("endless_sse")
    async with client(server.url, stream=True) as c:
        done = await c.chat([{"role": "user", "content": "hi"}])
    assert done.truncated and done.finish_reason_sent is None
    assert MAX_TOKENS < done.completion_tokens < 2 * MAX_TOKENS and done.text.startswith("tok tok")
    assert done.ttft_s is not None and server.requests == 1


@pytest.mark.parametrize("case, status, error_class", [("redirect", 307, "redirect"), ("status_405", 405, "http_405"),
                                                       ("status_402", 402, "http_402")])
async def test_a_redirect_or_a_4xx_fails_at_once_without_a_retry(hostile, case, status, error_class):
    server = await hostile(case)
    exc = await failure(server)
    assert (exc.status, exc.error_class, server.requests) == (status, error_class, 1)
    if case == "redirect":
        assert server.location and server.location in str(exc) and "use that URL as base_url" in str(exc)


async def test_the_start_check_of_a_wrong_port_names_what_answered_at_once(hostile):
    server = await hostile("banner")
    async with client(server.url) as c:
        check = StartCheck(c._transport, {}, probe_timeout=5, clock=lambda: 0.0, sleep=_never)
        listing = await check.endpoint(server.url, "hostile-model", deadline_s=60)
    assert not listing.up and listing.malformed is not None and "SSH-2.0-OpenSSH" in listing.malformed


async def _never(seconds: float) -> None:
    raise AssertionError("the start check waited for an endpoint that is not HTTP")


async def test_a_4xx_whose_message_is_not_valid_unicode_fails_the_item_with_a_message_a_ledger_takes(hostile):
    server = await hostile("answer", status=400, answer=b'{"error": {"message": "bad \\ud800 prompt \\u001b[2J"}}')
    exc = await failure(server)
    assert exc.error_class == "http_400" and "bad \ufffd prompt \\x1b[2J" in str(exc)
    str(exc).encode("utf-8")  # what the ledger stores as the item's error



#: The measured side of the test below, in a fresh interpreter of its own: tracemalloc counts every
#: thread of its process, and a test worker may still run another test's threads (an in-process
#: server finishing an endless answer), whose allocations would be charged to this client.
HUGE_ANSWERS = """
import asyncio, json, subprocess, sys, tracemalloc
from harvest.client import Client, RetryPolicy
from harvest.config import ClientConfig, SamplingConfig
case, stream, n, max_tokens = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), int(sys.argv[4])

async def main():
    proc = subprocess.Popen([sys.executable, "bench/hostile_server.py", "--case", case, "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    try:
        url = "http://" + (proc.stdout.readline() if proc.stdout else "").split()[-1]
        config = ClientConfig(concurrency=n, max_retries=0, request_timeout=30, stream=stream)
        async with Client([url], config, SamplingConfig(max_tokens=max_tokens), model="hostile-model",
                          retry=RetryPolicy(backoff_base=0.01, backoff_cap=0.02, probe_timeout=5)) as c:
            tracemalloc.start()
            try:
                got = await asyncio.gather(*(c.chat([{"role": "user", "content": f"q{i}"}]) for i in range(n)),
                                           return_exceptions=True)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
    finally:
        proc.terminate()  # the server this script started, by its pid
        proc.wait(timeout=10)
    classes = [getattr(o, "error_class", type(o).__name__) for o in got]
    print(json.dumps({"peak": peak, "classes": classes}))

asyncio.run(main())
"""


@pytest.mark.parametrize("case, stream", [("big_string", False), ("sse_long_line", True)])
def test_many_huge_answers_in_flight_at_once_cost_a_few_caps_not_one_each(case, stream):
    """A default that starts high sends an endpoint it knows nothing of hundreds of requests at once:
    when every answer is huge, what the client holds is bounded across them (a turn to read past
    ``FREE_READ``, nothing kept by a failure's traceback), not one cap per request in flight. The
    server is a subprocess of the client's own process (HUGE_ANSWERS), so that only the client's
    allocations are traced."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from harvest.transport import BIG_READS, FREE_READ
    n, cap = 128, 300 << 10  # an answer's cap at 64 tokens (~260 KiB) and a read past it
    out = subprocess.run([sys.executable, "-c", HUGE_ANSWERS, case, "1" if stream else "0", str(n), str(MAX_TOKENS)],
                         capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    peak, classes = got["peak"], got["classes"]
    assert classes == ["oversized"] * n, classes[:3]
    print(f"{case}: peak {peak / 2**20:.1f} MiB for {n} in flight (one cap each: {n * cap / 2**20:.0f} MiB)")
    # Below harvest, each connection waiting for its turn holds what its transport read: aiohttp
    # pauses reading past twice its 64 KiB buffer, after a socket read of up to 256 KiB (asyncio's
    # selector transport). Idle, the reads are small (2.6 MiB in all); on a loaded machine the kernel
    # fills each socket between reads and a whole read lands at once (37.7 MiB seen).
    transport = 2 * (64 << 10) + (256 << 10)
    assert peak < n * (FREE_READ + transport) + BIG_READS * cap, f"{peak:,} bytes allocated"
