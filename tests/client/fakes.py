"""Fakes and real-server helpers of the client tests (fixtures in conftest.py use them)."""

from __future__ import annotations

import asyncio
import json
import queue
import subprocess
import sys
import threading
from pathlib import Path

from harvest.client import RawResponse

LIVE_SERVER = Path(__file__).with_name("live_server.py")


class FakeTime:
    """A monotonic clock that only moves when the client sleeps; records every sleep."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


def chat_response(text: str = "hi", **message_extra: object) -> RawResponse:
    body = {
        "id": "c1", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text, **message_extra}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    }
    return RawResponse(200, json.dumps(body).encode())


def error_response(status: int, message: str = "nope", retry_after: str | None = None) -> RawResponse:
    return RawResponse(status, json.dumps({"error": {"message": message}}).encode(), retry_after)


class FakeServer:
    """Answers per (method, path) from scripts: each script is a list of responses/exceptions used
    in order (the last one repeats), or a callable. Records every request it sees."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], object] = {
            ("GET", "/health"): [RawResponse(200, b"")],
            ("GET", "/v1/models"): [RawResponse(200, b'{"data": [{"id": "served-model"}]}')],
            ("POST", "/v1/chat/completions"): [chat_response()],
        }
        self.seen: list[tuple[str, str, str, dict | None, dict[str, str]]] = []

    def script(self, method: str, path: str, *answers: object) -> None:
        self.routes[(method, path)] = list(answers)

    def count(self, method: str, path: str, base: str | None = None) -> int:
        return sum(1 for m, b, p, _, _ in self.seen if m == method and p == path and (base is None or b == base))

    def bodies(self, path: str) -> list[dict]:
        return [body for m, _, p, body, _ in self.seen if p == path and body is not None]

    def handler(self, method: str, url: str, body: bytes | None, headers: dict[str, str]):
        scheme, _, rest = url.partition("://")
        host, _, path = rest.partition("/")
        base, path = f"{scheme}://{host}", "/" + path
        self.seen.append((method, base, path, json.loads(body) if body else None, headers))
        script = self.routes.get((method, path))
        if script is None:
            return RawResponse(404, b'{"detail": "Not Found"}')
        if callable(script):
            answer = script(base)
        else:
            answer = script.pop(0) if len(script) > 1 else script[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer


class LiveServer:
    """A ``live_server.py`` subprocess on 127.0.0.1; killed by its pid."""

    def __init__(self, *args: str, port: int = 0):
        self.proc = subprocess.Popen([sys.executable, str(LIVE_SERVER), "--port", str(port), *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: lines.put(self.proc.stdout.readline()), daemon=True).start()
        try:
            line = lines.get(timeout=30)
        except queue.Empty:
            self.kill()
            raise RuntimeError("live server did not report its port within 30 s") from None
        if not line.startswith("listening on "):
            self.kill()
            raise RuntimeError(f"live server failed: {line!r} {self.proc.stderr.read()[-2000:]}")
        self.port = int(line.rsplit(":", 1)[1])
        self.url = f"http://127.0.0.1:{self.port}"

    def kill(self) -> None:
        """SIGKILL this server (no cleanup, like a crashed engine) and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream:
                stream.close()
