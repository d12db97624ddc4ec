"""A tiny real OpenAI-compatible HTTP server that the client tests run as a subprocess and kill by pid.

    python live_server.py [--port 0] [--hang-chat] [--chat-delay S] [--api-key K] [--metrics]
                          [--health-status N]

It binds its socket itself and prints ``listening on 127.0.0.1:PORT`` once it accepts connections.
Its answers name its port, so a test can tell which server replied; ``GET /stats`` returns how many
chat requests it received. ``--hang-chat`` never answers a chat request (to be killed mid-request);
``--api-key`` answers 401 echoing the presented key, the way some servers do, so that redaction is
tested against a real echo.
"""

from __future__ import annotations

import argparse
import asyncio
import socket

from aiohttp import web


def build_app(args: argparse.Namespace, port: int) -> web.Application:
    counts = {"chat": 0, "completions": 0}

    async def chat(request: web.Request) -> web.Response:
        counts["chat"] += 1
        if args.api_key is not None:
            presented = request.headers.get("Authorization", "").removeprefix("Bearer ")
            if presented != args.api_key:
                return web.json_response(
                    {"error": {"message": f"Incorrect API key provided: {presented}", "type": "auth"}}, status=401)
        body = await request.json()
        if args.hang_chat:
            await asyncio.sleep(3600)
        if args.chat_delay:
            await asyncio.sleep(args.chat_delay)
        names = args.models.split(",")
        asked = body.get("model")
        if asked is not None and asked not in names:  # as vLLM answers a model it does not serve
            return web.json_response({"error": {"message": f"The model `{asked}` does not exist.",
                                                "type": "NotFoundError"}}, status=404)
        return web.json_response({
            "id": "x", "object": "chat.completion", "model": asked or names[0],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": f"reply from {port}",
                                     "reasoning_content": f"saw {len(body['messages'])} messages"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
        })

    async def health(request: web.Request) -> web.Response:
        return web.Response(status=args.health_status)

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": name, "object": "model"}
                                                             for name in args.models.split(",")]})

    async def metrics(request: web.Request) -> web.Response:
        if not args.metrics:
            raise web.HTTPNotFound()
        text = (
            "# HELP vllm:num_requests_running Running requests.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{engine="0",model_name="live-model"} 3.0\n'
            'vllm:num_requests_running{engine="1",model_name="live-model"} 2.0\n'
            'vllm:num_requests_waiting{engine="0",model_name="live-model"} 7.0\n'
        )
        return web.Response(text=text, content_type="text/plain")

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(counts)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/stats", stats)
    return app


async def serve(args: argparse.Namespace) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    port = sock.getsockname()[1]
    runner = web.AppRunner(build_app(args, port), access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    print(f"listening on 127.0.0.1:{port}", flush=True)
    try:
        await asyncio.Event().wait()  # until the test kills this process
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--hang-chat", action="store_true")
    parser.add_argument("--chat-delay", type=float, default=0.0)
    parser.add_argument("--api-key")
    parser.add_argument("--metrics", action="store_true")
    parser.add_argument("--health-status", type=int, default=200)
    parser.add_argument("--models", default="live-model", help="served model names, comma-separated")
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
