"""A minimal, fast OpenAI-compatible null server for client benchmarks and tests.

It answers every chat or text completion with the same short reply and a usage block, without a
model, so that what a benchmark measures is the client's cost per request and not the server's.
It speaks HTTP/1.1 with keep-alive on a raw asyncio protocol (no framework) and serves:

    POST /v1/chat/completions   fixed chat reply        GET /health     200, empty body
    POST /v1/completions        fixed text reply        GET /v1/models  one model, "null-model"
    GET  /metrics               a few vLLM/SGLang-style Prometheus samples
    anything else               404 with an OpenAI-style error body

Run: ``python bench/null_server.py [--host 127.0.0.1] [--port 0]``. It binds first and then prints
``listening on HOST:PORT`` on stdout, so a caller reads the real port instead of guessing a free one.
It never reads the request body beyond its length and never implements more of HTTP than clients
of an OpenAI endpoint use (no chunked request bodies, no TLS).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys

_CHAT = json.dumps({
    "id": "chatcmpl-null", "object": "chat.completion", "created": 0, "model": "null-model",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello from the null server."},
                 "finish_reason": "stop", "logprobs": None}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
}).encode()
_TEXT = json.dumps({
    "id": "cmpl-null", "object": "text_completion", "created": 0, "model": "null-model",
    "choices": [{"index": 0, "text": " Hello from the null server.", "finish_reason": "stop", "logprobs": None}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
}).encode()

def _sse(events: list[dict]) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


# The same answer streamed (a request whose body holds "stream":true): one event per token, then
# the usage event (stream_options.include_usage, as vLLM), then [DONE]; written at once.
_WORDS = ["Hello", " from", " the", " null", " server", ".", ""]
_CHAT_STREAM = _sse(
    [{"id": "chatcmpl-null", "object": "chat.completion.chunk", "model": "null-model",
      "choices": [{"index": 0, "delta": {"content": w}, "finish_reason": "stop" if i == 6 else None}]}
     for i, w in enumerate(_WORDS)]
    + [{"id": "chatcmpl-null", "model": "null-model", "choices": [],
        "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}}])
_MODELS = json.dumps({"object": "list", "data": [{"id": "null-model", "object": "model", "owned_by": "null"}]}).encode()
_METRICS = (
    b"# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    b"# TYPE vllm:num_requests_running gauge\n"
    b'vllm:num_requests_running{model_name="null-model"} 0.0\n'
    b"# TYPE vllm:num_requests_waiting gauge\n"
    b'vllm:num_requests_waiting{model_name="null-model"} 0.0\n'
)
_NOT_FOUND = json.dumps({"error": {"message": "not found", "type": "not_found_error", "code": 404}}).encode()

_REASONS = {200: b"OK", 404: b"Not Found", 400: b"Bad Request", 501: b"Not Implemented"}


def _response(status: int, body: bytes, content_type: bytes = b"application/json", close: bool = False) -> bytes:
    head = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n" % (
        status, _REASONS.get(status, b"X"), content_type, len(body))
    if close:
        head += b"connection: close\r\n"
    return head + b"\r\n" + body


# Ready-made keep-alive responses: the hot path is one dict lookup and one write.
_ROUTES = {
    (b"POST", b"/v1/chat/completions"): _response(200, _CHAT),
    (b"POST", b"/v1/completions"): _response(200, _TEXT),
    (b"GET", b"/health"): _response(200, b"", b"text/plain"),
    (b"GET", b"/v1/models"): _response(200, _MODELS),
    (b"GET", b"/metrics"): _response(200, _METRICS, b"text/plain; version=0.0.4"),
}
_404 = _response(404, _NOT_FOUND)
_STREAMED = _response(200, _CHAT_STREAM, b"text/event-stream")


class _HttpProtocol(asyncio.Protocol):
    """One connection: parse pipelined HTTP/1.1 requests, answer each from the route table."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        out = []
        close = False
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            head = bytes(self.buffer[:end])
            lines = head.split(b"\r\n")
            parts = lines[0].split(b" ")
            if len(parts) != 3:
                out.append(_response(400, b"", close=True))
                close = True
                break
            length = 0
            chunked = False
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value.strip())
                elif name == b"transfer-encoding":
                    chunked = True
                elif name == b"connection" and value.strip().lower() == b"close":
                    close = True
            if chunked:
                out.append(_response(501, b"", close=True))
                close = True
                break
            if len(self.buffer) < end + 4 + length:
                break  # body not complete yet
            streamed = b'"stream":true' in self.buffer[end + 4: end + 4 + length]
            del self.buffer[: end + 4 + length]
            path = parts[1].split(b"?", 1)[0]
            if streamed and path == b"/v1/chat/completions":
                out.append(_STREAMED)
            else:
                out.append(_ROUTES.get((parts[0], path), _404))
            if close:
                break
        if out and self.transport is not None:
            self.transport.write(b"".join(out))
            if close:
                self.transport.close()


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_HttpProtocol, host, port, backlog=1024, reuse_address=True)
    bound = server.sockets[0].getsockname()
    print(f"listening on {bound[0]}:{bound[1]}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = let the OS choose; the port is printed")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
