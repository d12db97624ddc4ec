"""A small OpenAI-compatible endpoint of the test's own, on loopback, in a thread of the test
process, and a receiver of POSTed documents: for the run tests whose behaviour is the client's
(notices, metrics), where a real engine adds nothing but time.

    with Endpoint(mode="answer") as ep:      # answers every chat completion at once
        ep.hold_after(40)                    # from the 41st on, completions are held (a hung engine)
        ep.release()                         # ... and answered again
    with Endpoint(mode="bad_request"):       # every completion answers 400: the breaker trips
    with Receiver() as rx:                   # rx.url takes POSTs; rx.docs are their JSON bodies
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from aiohttp import web


class LoopbackServer:
    """An aiohttp app served from its own loop in a daemon thread, on 127.0.0.1, a port the OS picks."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._started = threading.Event()
        self.port = 0

    def app(self) -> web.Application:
        raise NotImplementedError

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._runner = web.AppRunner(self.app(), access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._started.set()
        self._loop.run_forever()

    def __enter__(self) -> Any:
        threading.Thread(target=self._serve, daemon=True).start()
        assert self._started.wait(10), "the loopback server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        async def down() -> None:
            assert self._runner is not None
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(down(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class Endpoint(LoopbackServer):
    """A model ``m`` that answers (``mode="answer"``) or refuses every request (``"bad_request"``)."""

    def __init__(self, mode: str = "answer"):
        super().__init__()
        self.mode = mode
        self.answered = 0
        self._hold_after: int | None = None
        self._released = threading.Event()

    def hold_after(self, n: int) -> None:
        self._released.clear()
        self._hold_after = n

    def release(self) -> None:
        self._hold_after = None
        self._released.set()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m"}]})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        if self.mode == "bad_request":
            return web.json_response({"error": {"message": "the prompt is malformed", "type": "invalid"}}, status=400)
        if self._hold_after is not None and self.answered >= self._hold_after:
            while not self._released.is_set():  # held, as a hung engine holds it
                await asyncio.sleep(0.05)
        self.answered += 1
        if body.get("stream") is True:
            return await self._stream(request)
        return web.json_response({
            "id": "c", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": f"answer {self.answered}"},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}})


    async def _stream(self, request: web.Request) -> web.StreamResponse:
        """Three tokens, a few ms apart, then the usage (``stream_options.include_usage``) and ``[DONE]``."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i, word in enumerate(("one", " two", " three")):
            await asyncio.sleep(0.002)
            chunk = {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [
                {"index": 0, "delta": {"content": word}, "finish_reason": "stop" if i == 2 else None}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
        await resp.write(b"data: " + json.dumps({"id": "c", "model": "m", "choices": [], "usage": usage}).encode()
                         + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp


class Receiver(LoopbackServer):
    """Takes POSTs at ``/hook`` (their JSON bodies in :attr:`docs`); ``status`` is what it answers,
    ``delay`` how long it waits first."""

    def __init__(self, status: int = 200, delay: float = 0.0):
        super().__init__()
        self.status, self.delay = status, delay
        self.docs: list[dict[str, Any]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/hook/{key}", self._hook)
        return app

    async def _hook(self, request: web.Request) -> web.Response:
        self.docs.append(json.loads(await request.read()))
        if self.delay:
            await asyncio.sleep(self.delay)
        return web.Response(status=self.status, text="")

    @property
    def url(self) -> str:
        return f"{super().url}/hook/SECRETKEY123"
