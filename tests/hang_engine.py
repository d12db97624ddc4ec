"""A real llama-server behind a loopback proxy that can hang: completions held, /health answered.

    python tests/hang_engine.py [--hang-after N] [--once MARKER | --first-launch MARKER] [--ignore-term]
        -- LLAMA_SERVER ARGS...

It starts ``LLAMA_SERVER ARGS`` on a port of its own (``--port`` of ARGS is taken for the proxy),
in its own process group (the group harvest's verified stop signals), and forwards every request
to it. It plays the engine a scheduler or a collective wedged (vLLM #13134, #1492): after ``N``
completions answered (``--hang-after``), or from a SIGUSR1 on, every completion request is held
and never forwarded, while ``/health``, ``/v1/models`` and ``/metrics`` are still forwarded and
answered (the engine behind is idle: its token counter stands still). ``--once MARKER``: hang only
when MARKER does not exist yet, and create it when the hang begins (the relaunched engine answers).
``--first-launch MARKER``: hang only in the engine that found no MARKER at its start and created it
(the first launch; a relaunch, or the launch of a later session, answers everything, whenever the
first one was stopped).
``--ignore-term``: the proxy ignores SIGTERM (llama-server behind it exits; the proxy keeps the
port), so only a SIGKILL of the group ends it; ``--ignore-term-if FILE``: the same when FILE exists as
SIGTERM arrives (a fault armed at a chosen moment). ``--no-metrics``: ``/metrics`` answers 404 (an engine without it). ``--version`` is
passed to llama-server as it is.

As a command for ``[server] command`` (harvest appends ``-m MODEL --host H --port P ...``) or
started by a test with :func:`tests.engines.start_engine`. It never signals anything but its own
child, and stops it when it exits.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
from aiohttp import web

COMPLETIONS = ("/v1/chat/completions", "/v1/completions")
HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proxy:
    def __init__(self, upstream: str, hang_after: int | None, once: Path | None, *, metrics: bool = True):
        self.upstream = upstream
        self.metrics = metrics
        self.hang_after = hang_after
        self.once = once
        self.answered = 0
        self.hanging = False
        self.session: aiohttp.ClientSession | None = None

    def start_hang(self) -> None:
        if self.hanging:
            return
        if self.once is not None:
            if self.once.exists():
                return
            self.once.write_text(str(os.getpid()))
        self.hanging = True
        print(f"hang_engine: holding every completion from now on ({self.answered} answered)", flush=True)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        completion = request.method == "POST" and request.path in COMPLETIONS
        if request.path == "/metrics" and not self.metrics:
            return web.Response(status=404, text="Not Found")
        if completion and self.hang_after is not None and self.answered >= self.hang_after:
            self.start_hang()
        if completion and self.hanging:
            await asyncio.Event().wait()  # held: never forwarded, never answered
        assert self.session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        try:
            async with self.session.request(request.method, self.upstream + request.path_qs, data=body,
                                            headers=headers) as up:
                out = web.StreamResponse(status=up.status, headers={
                    k: v for k, v in up.headers.items() if k.lower() not in HOP})
                await out.prepare(request)
                async for chunk in up.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
        except aiohttp.ClientError:
            return web.Response(status=503, text="upstream unavailable")
        if completion and up.status == 200:
            self.answered += 1
        return out


async def serve(host: str, port: int, proxy: Proxy, engine: subprocess.Popen[bytes], args: argparse.Namespace) -> int:
    proxy.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, proxy.start_hang)
    try:
        while engine.poll() is None or args.ignore_term:  # ignoring SIGTERM: holds the port until SIGKILL
            await asyncio.sleep(0.2)
        return engine.returncode or 1  # the engine behind is gone: so is this one
    finally:
        await runner.cleanup()
        await proxy.session.close()


def main() -> int:
    argv = sys.argv[1:]
    if "--" not in argv:
        print("usage: hang_engine.py [options] -- LLAMA_SERVER ARGS...", file=sys.stderr)
        return 2
    cut = argv.index("--")
    ap = argparse.ArgumentParser()
    ap.add_argument("--hang-after", type=int, default=None)
    ap.add_argument("--once", type=Path, default=None)
    ap.add_argument("--first-launch", type=Path, default=None)
    ap.add_argument("--ignore-term", action="store_true")
    ap.add_argument("--ignore-term-if", type=Path, default=None,
                    help="ignore SIGTERM when this file exists as it arrives")
    ap.add_argument("--no-metrics", action="store_true", help="answer /metrics 404, as an engine without it")
    args = ap.parse_args(argv[:cut])
    engine_argv = argv[cut + 1:]
    if "--version" in engine_argv:
        return subprocess.run(engine_argv, stdin=subprocess.DEVNULL, timeout=30).returncode
    host, port = "127.0.0.1", None
    inner = list(engine_argv)
    for i, arg in enumerate(inner[:-1]):
        if arg == "--host":
            host = inner[i + 1]
        if arg == "--port":
            port = int(inner[i + 1])
            inner_port = _free_port()
            inner[i + 1] = str(inner_port)
    if port is None:
        print("hang_engine.py: the engine's arguments name no --port", file=sys.stderr)
        return 2
    inner_host = next((inner[i + 1] for i, a in enumerate(inner[:-1]) if a == "--host"), "127.0.0.1")
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif args.ignore_term_if is not None:
        flag = args.ignore_term_if

        def on_term(signum: int, frame: object) -> None:
            if flag.exists():
                args.ignore_term = True  # from now on it holds the port until SIGKILL
                print("hang_engine: SIGTERM ignored", flush=True)
                return
            raise SystemExit(143)

        signal.signal(signal.SIGTERM, on_term)
    if args.first_launch is not None:
        try:
            with args.first_launch.open("x") as marker:
                marker.write(str(os.getpid()))
        except FileExistsError:
            args.hang_after = None  # a later launch: it answers everything
    engine = subprocess.Popen(inner, stdin=subprocess.DEVNULL)  # same group: the stop signals both
    try:
        return asyncio.run(serve(host, port, Proxy(f"http://{inner_host}:{inner_port}", args.hang_after, args.once,
                                                   metrics=not args.no_metrics), engine, args))
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
