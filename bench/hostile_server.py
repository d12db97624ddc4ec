"""An OpenAI-compatible endpoint that answers ``/health`` and ``/v1/models`` well and completions badly.

    python bench/hostile_server.py --case CASE [--port 0] [--size BYTES] [--model NAME]

prints ``listening on 127.0.0.1:PORT`` once it listens, and serves until SIGTERM. A raw asyncio
server (not aiohttp's: its server cannot send a malformed message), so every byte on the wire is
the case's. Each completion request gets the case's answer:

    ok              a valid chat (or text) completion; streamed when asked (``stream: true``)
    gzip_bomb       200, ``Content-Encoding: gzip``: ``--size`` bytes of JSON text once inflated (2 GB
                    by default, about 2 MB on the wire)
    big_body        200 with ``Content-Length: --size`` (1 GB by default), a completion whose content
                    never ends, sent as fast as the client reads
    big_string      the same without a length (chunked): a completion with a ``--size`` string, the
                    client must count what it reads
    endless_sse     a stream of one-token events that never ends (``[client] stream = true``)
    sse_long_line   a stream whose first ``data:`` line is ``--size`` bytes with no newline
    bad_status      ``HTTP/1.1 abc OK``
    many_headers    10,000 headers
    big_header      one header of 20 KB
    bad_chunk       chunked, then a chunk size that is not hexadecimal (after the head was read)
    dup_length      two different ``Content-Length`` headers
    banner          an SSH server on the wrong port: its banner before anything, on every path
    redirect        307 to ``--location`` (default: another port of this host)
    status_405      405 (also 402, 410: ``status_402``, ``status_410``) with a JSON error
    answer          ``--answer FILE``'s bytes as the 200 body (odd numbers, odd types, bad text); in
                    process, ``answers`` picks one by the request's prompt (its last message)

Used in-process by the tests (:class:`HostileServer` in the test's event loop, or
:func:`serve_in_thread` beside a ``harvest run`` subprocess) and as a subprocess by
``bench/hostile.py``. It counts what it sent of completions (``sent``), so a test can show that a
client stopped reading early. It never reads more than 1 MiB of a request and closes every
connection it opened when it stops.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import threading
import zlib
from collections.abc import Iterator, Mapping

CASES = ("ok", "gzip_bomb", "big_body", "big_string", "endless_sse", "sse_long_line", "bad_status",
         "many_headers", "big_header", "bad_chunk", "dup_length", "banner", "redirect", "status_402",
         "status_405", "status_410", "answer")
MODEL = "hostile-model"
BANNER = b"SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n"
_PIECE = 1 << 16


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


def gzip_bomb(size: int, prefix: bytes = b'{"choices": [{"message": {"content": "') -> bytes:
    """A gzip body that inflates to ``size`` bytes: ``prefix`` then spaces (level 9: ~1000 to 1)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [packer.compress(prefix)]
    block = b" " * (1 << 20)
    left = size - len(prefix)
    while left > 0:
        out.append(packer.compress(block[:min(left, len(block))]))
        left -= len(block)
    out.append(packer.flush())
    return b"".join(out)


def completion(text: str = "hello there", *, chat: bool = True, finish: str | None = "stop",
               completion_tokens: int = 2) -> bytes:
    choice: dict[str, object] = {"index": 0, "finish_reason": finish}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return json.dumps({"id": "x", "object": "chat.completion" if chat else "text_completion", "model": MODEL,
                       "choices": [choice],
                       "usage": {"prompt_tokens": 5, "completion_tokens": completion_tokens,
                                 "total_tokens": 5 + completion_tokens}}).encode()


class HostileServer:
    """One case on a loopback port of its own (see the module docstring)."""

    def __init__(self, case: str, *, size: int | None = None, model: str = MODEL, answer: bytes | None = None,
                 answers: Mapping[str, bytes] | None = None, location: str | None = None, status: int = 200):
        if case not in CASES:
            raise ValueError(f"unknown case {case!r}: one of {', '.join(CASES)}")
        self.case, self.model, self.answer, self.location, self.status = case, model, answer, location, status
        self.answers = dict(answers or {})
        default = {"gzip_bomb": 2 << 30, "big_body": 1 << 30, "big_string": 500 << 20, "sse_long_line": 100 << 20}
        self.size = size if size is not None else default.get(case, 0)
        self._bomb: bytes | None = None
        #: Bytes sent of completions' answers (head included), and completion requests seen.
        self.sent = 0
        self.requests = 0
        self.port = 0
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> str:
        if self.case == "gzip_bomb":
            self._bomb = await asyncio.to_thread(gzip_bomb, self.size)
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", port, limit=1 << 20)
        self.port = self._server.sockets[0].getsockname()[1]
        if self.case == "redirect" and self.location is None:
            self.location = f"http://127.0.0.1:{self.port + 1}/v1/chat/completions"
        return self.url

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        if self._server is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            if self.case == "banner":
                writer.write(BANNER)
                await writer.drain()
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; False when the connection is done."""
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path = (lines[0].split(" ") + ["", ""])[:2]
        length = next((int(x.split(":", 1)[1]) for x in lines[1:] if x.lower().startswith("content-length:")), 0)
        body = await reader.readexactly(min(length, 1 << 20))
        if self.case == "banner":
            writer.write(b"Invalid SSH identification string.\r\n")
            await writer.drain()
            return False
        path = path.split("?", 1)[0]
        if method == "GET" and path in ("/health", "/v1/models"):
            doc = {} if path == "/health" else {"object": "list", "data": [{"id": self.model, "object": "model"}]}
            await self._send(writer, 200, json.dumps(doc).encode())
            return True
        if method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            self.requests += 1
            request = json.loads(body or b"{}")
            return await self._answer(writer, request, chat=path.endswith("chat/completions"))
        await self._send(writer, 404, b'{"detail": "Not Found"}')
        return True

    async def _send(self, writer: asyncio.StreamWriter, status: int, body: bytes, headers: str = "",
                    count: bool = False) -> None:
        data = (f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                f"{headers}\r\n").encode() + body
        writer.write(data)
        await writer.drain()
        if count:
            self.sent += len(data)

    async def _write(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        await writer.drain()
        self.sent += len(data)

    async def _answer(self, writer: asyncio.StreamWriter, request: dict[str, object], chat: bool) -> bool:
        case = self.case
        stream = bool(request.get("stream"))
        if case == "ok":
            if stream:
                await self._sse(writer, chat, events=3)
                return True
            await self._send(writer, 200, completion(chat=chat), count=True)
            return True
        if case == "answer":
            messages = request.get("messages")
            prompt = messages[-1].get("content") if isinstance(messages, list) and messages else request.get("prompt")
            body = self.answers.get(prompt, self.answer or b"") if isinstance(prompt, str) else self.answer or b""
            await self._send(writer, self.status, body, count=True)
            return True
        if case.startswith("status_"):
            status = int(case[7:])
            said = {"error": {"message": f"status {status} for every request"}}
            await self._send(writer, status, json.dumps(said).encode(), count=True)
            return True
        if case == "redirect":
            await self._send(writer, 307, b"", f"Location: {self.location}\r\n", count=True)
            return True
        raw = {
            "bad_status": b"HTTP/1.1 abc OK\r\nContent-Length: 2\r\n\r\n{}",
            "many_headers": b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(10_000))
                            + b"Content-Length: 2\r\n\r\n{}",
            "big_header": b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 20_000 + b"\r\nContent-Length: 2\r\n\r\n{}",
            "dup_length": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        }.get(case)
        if raw is not None:
            await self._write(writer, raw)
            return False
        if case == "bad_chunk":
            await self._write(writer, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                      b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(b'{"choices": '))
            await asyncio.sleep(0.05)  # the head is read and the body begun before the bad size
            await self._write(writer, b"zz\r\nabc\r\n0\r\n\r\n")
            return False
        if case == "gzip_bomb":
            assert self._bomb is not None
            await self._write(writer, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
                                      b"Content-Length: %d\r\n\r\n" % len(self._bomb))
            for at in range(0, len(self._bomb), _PIECE):
                await self._write(writer, self._bomb[at:at + _PIECE])
            return True
        if case in ("big_body", "big_string"):
            return await self._endless_body(writer, chunked=case == "big_string")
        if case == "endless_sse":
            await self._sse(writer, chat, events=None)
            return False
        if case == "sse_long_line":
            await self._write(writer, b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                      b"Transfer-Encoding: chunked\r\n\r\n")
            await self._write(writer, _chunked(b'data: {"choices": [{"index": 0, "delta": {"content": "'))
            piece = _chunked(b"a" * _PIECE)
            for _ in range(self.size // _PIECE):
                await self._write(writer, piece)
            await self._write(writer, _chunked(b'"}}]}\n\n') + b"0\r\n\r\n")
            return True
        raise AssertionError(case)

    async def _endless_body(self, writer: asyncio.StreamWriter, *, chunked: bool) -> bool:
        opening = b'{"choices": [{"index": 0, "finish_reason": "stop", "message": {"content": "'
        closing = b'"}}], "usage": {"completion_tokens": 2}}'
        length = max(self.size, len(opening) + len(closing))
        framing = b"Transfer-Encoding: chunked" if chunked else b"Content-Length: %d" % length
        await self._write(writer, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + framing + b"\r\n\r\n")
        wrap = _chunked if chunked else (lambda data: data)
        await self._write(writer, wrap(opening))
        left = length - len(opening) - len(closing)
        piece = b"a" * _PIECE
        while left > 0:
            await self._write(writer, wrap(piece[:min(left, _PIECE)]))
            left -= _PIECE
        await self._write(writer, wrap(closing) + (b"0\r\n\r\n" if chunked else b""))
        return True

    async def _sse(self, writer: asyncio.StreamWriter, chat: bool, events: int | None) -> None:
        await self._write(writer, b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                  b"Transfer-Encoding: chunked\r\n\r\n")
        one = {"index": 0, "delta": {"content": "tok "}} if chat else {"index": 0, "text": "tok "}
        event = b"data: " + json.dumps({"model": self.model, "choices": [one]}).encode() + b"\n\n"
        if events is not None:
            last = {**one, "finish_reason": "stop"}
            tail = (b"data: " + json.dumps({"choices": [last]}).encode() + b"\n\n"
                    + b"data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": 5,
                                                                        "completion_tokens": events + 1}}).encode()
                    + b"\n\ndata: [DONE]\n\n")
            await self._write(writer, _chunked(event * events + tail) + b"0\r\n\r\n")
            return
        batch = _chunked(event * 64)
        while True:  # never ends: the client must stop reading
            await self._write(writer, batch)


@contextlib.contextmanager
def serve_in_thread(case: str, **kwargs: object) -> Iterator[HostileServer]:
    """:class:`HostileServer` on an event loop of its own thread (beside a subprocess under test);
    stopped, every connection closed, when the block ends."""
    server = HostileServer(case, **kwargs)  # type: ignore[arg-type]
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(server.start())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            failed.append(exc)
            ready.set()
            return
        ready.set()
        loop.run_forever()
        loop.run_until_complete(server.close())
        loop.close()

    thread = threading.Thread(target=run, name=f"hostile-{case}", daemon=True)
    thread.start()
    if not ready.wait(60) or failed:
        raise RuntimeError(f"the hostile server did not start: {failed[0] if failed else 'no answer in 60 s'}")
    try:
        yield server
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="an OpenAI-compatible endpoint that answers badly")
    parser.add_argument("--case", required=True, choices=CASES)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--size", type=int, default=None)
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--location", default=None)
    parser.add_argument("--answer", default=None, help="a file whose bytes are the 200 body (case answer)")
    args = parser.parse_args(argv)
    answer = open(args.answer, "rb").read() if args.answer else None

    async def serve() -> None:
        server = HostileServer(args.case, size=args.size, model=args.model, answer=answer, location=args.location)
        await server.start(args.port)
        print(f"listening on 127.0.0.1:{server.port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await server.close()

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
