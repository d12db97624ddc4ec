"""Real HTTP endpoints that misbehave the way servers in the field do, for the display tests: one
that is sick (its completions and /health answer 503) and one that is hung (it accepts a completion
request and never answers, holding the connection open). Both list a model on /v1/models, so a run
starts against them. Each runs in a thread of the test process, on loopback, on a port the OS picks."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    mode = "sick"
    model = "sim-model"

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            self._send(200, {"object": "list", "data": [{"id": self.model, "object": "model"}]})
        elif self.path == "/health":
            self._send(503 if self.mode == "sick" else 200, {"status": "unavailable" if self.mode == "sick" else "ok"})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        if self.mode == "hung":
            self.server.stopped.wait()  # type: ignore[attr-defined]  # nothing back until the test ends
            return
        self._send(503, {"error": {"message": "the engine is overloaded", "type": "unavailable"}})


@contextmanager
def misbehaving(mode: str, model: str = "sim-model") -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a ``"sick"`` or ``"hung"`` endpoint, stopped on exit."""
    handler = type(f"_{mode.title()}Handler", (_Handler,), {"mode": mode, "model": model})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    server.stopped = threading.Event()  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.stopped.set()  # type: ignore[attr-defined]
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
