"""A simulated LLM engine: an OpenAI-compatible server with a fixed per-token latency and a batch.

It behaves like a continuous-batching engine without a model, so that a benchmark of many servers
measures harvest (its client, its ledger, the placement) and not this machine's cores:

- at most ``--max-batch`` requests decode at once; the others wait in a FIFO queue and join the
  batch as soon as a slot frees (between two steps, like vLLM's scheduler);
- one decode step takes ``--token-latency`` seconds (plus ``--step-per-seq`` per running request:
  a GPU whose step grows with the batch) and gives every running request one token;
  the step is one ``asyncio.sleep`` for the whole batch, on a drift-free clock, so the CPU a step
  costs does not grow with the batch and a server's rate is ``max_batch / token_latency`` tokens/s;
  ``--no-metrics`` answers /metrics with 404 (``transformers serve``); ``--stream-cost F`` makes
  every step ``1 + F`` times longer while a streamed request runs (``transformers serve`` made
  x0.63-0.65 of its tok/s on the H200 with one streamed request beside 512: F about 0.55);
- a request generates ``min(max_tokens, --output-tokens)`` tokens (``--output-tokens 0``: always
  ``max_tokens``); ``finish_reason`` is ``length`` when it stopped at ``max_tokens``, else ``stop``;
- ``--prefill S``: each request waits S seconds before it joins the batch (a known time to first token);
- ``--preset transformers-h100``: the curve of ``transformers serve`` 5.17 with a random 1.0B Llama on
  an H100 as an endpoint harvest did not launch (measured 2026-12-06): a decode step of 0.117 s at
  64 running that grows 35 % to 0.158 s at 512 (0.11115 s + 0.0914 ms per running request), a
  0.27 s prefill, 1024 requests at once (its ``max_requests_per_batch``), no /metrics, nothing that
  publishes its capacity; answers of equal length are the default (``--output-tokens 0``);
- ``--dialect``: which engine's capacity endpoints and metric names it speaks (below).

Endpoints:

    POST /v1/chat/completions   ``usage`` counts (prompt: whitespace words of the messages);
                                ``stream: true`` sends one server-sent event per token
    POST /v1/completions        the same for ``prompt``
    GET  /v1/models             one model (``--model``, default ``sim-model``)
    GET  /health                200 once listening
    GET  /metrics               Prometheus text in the dialect's names (404 with ``--no-metrics``):
                                running and waiting requests (gauges), generated tokens (a counter),
                                ``sim:steps_total``; vLLM's also ``vllm:prompt_tokens_total``,
                                ``vllm:request_success_total`` and ``vllm:cache_config_info`` (labels
                                ``block_size``, ``num_gpu_blocks``: its KV capacity)

Capacity endpoints, by ``--dialect`` (the shapes harvest reads, docs/engines.md):

    vllm          (the default) nothing but /metrics; with ``--dev-mode`` (vLLM's
                  ``VLLM_SERVER_DEV_MODE=1``) ``GET /server_info?config_format=json`` answers
                  ``{"vllm_config": {"scheduler_config": {"max_num_seqs": MAX_BATCH}, ...}}``
    sglang        ``GET /server_info`` (and the deprecated ``/get_server_info``): SGLang 0.5.23's
                  shape, ``max_running_requests``, ``max_total_num_tokens`` and ``internal_states``
                  with ``effective_max_running_requests_per_dp`` (MAX_BATCH); metrics ``sglang:``
    llamacpp      ``GET /props``: ``total_slots`` (MAX_BATCH) and ``default_generation_settings.n_ctx``;
                  metrics ``llamacpp:``
    transformers  none, and /metrics 404 (``transformers serve``)

Run: ``python bench/sim_engine.py --port 0 --token-latency 0.02 --max-batch 16``. It binds first and
then prints ``listening on HOST:PORT``, so a caller reads the real port instead of guessing a free
one; SIGTERM or SIGINT end it. It must not import harvest (it stands for an engine).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import sys
import time
from collections import deque
from dataclasses import dataclass, field

from aiohttp import web

_WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")


@dataclass
class _Seq:
    """One request in the engine: how many tokens it wants, how many it has, who waits for it."""

    target: int
    future: asyncio.Future[int]
    done: int = 0
    #: A streamed request: each token's step puts the running count here.
    tokens: asyncio.Queue[int] | None = None


@dataclass
class SimEngine:
    """The scheduler: a running batch of at most ``max_batch``, a FIFO queue, one step per latency."""

    token_latency: float
    max_batch: int
    step_per_seq: float = 0.0
    #: Extra share of a step while a streamed request runs (``transformers serve`` on the H200 made
    #: x0.63-0.65 of its tok/s at 512 with one streamed request beside: about 0.55).
    stream_cost: float = 0.0
    #: Seconds a request spends before it joins the batch (a prefill): its first token comes one step
    #: after that at the earliest.
    prefill: float = 0.0
    running: list[_Seq] = field(default_factory=list)
    waiting: deque[_Seq] = field(default_factory=deque)
    steps: int = 0
    finished: int = 0
    generated: int = 0
    prompt_tokens: int = 0

    def __post_init__(self) -> None:
        self._wake = asyncio.Event()

    async def generate(self, prompt_tokens: int, tokens: int, stream: asyncio.Queue[int] | None = None) -> int:
        """Queue a request for ``tokens`` tokens; returns once they are generated (``stream``: gets
        each token's count as its step ends)."""
        seq = _Seq(max(1, tokens), asyncio.get_running_loop().create_future(), tokens=stream)
        if self.prefill:
            await asyncio.sleep(self.prefill)
        self.prompt_tokens += prompt_tokens
        self.waiting.append(seq)
        self._wake.set()
        return await seq.future

    async def loop(self) -> None:
        """Run steps while there is work; sleep on an event when there is none."""
        next_step = 0.0
        while True:
            if not self.running and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
                next_step = 0.0
            while self.waiting and len(self.running) < self.max_batch:
                seq = self.waiting.popleft()
                if not seq.future.done():  # a request whose client went away is dropped
                    self.running.append(seq)
            # Drift-free: a step starts one latency after the previous one was due, so time spent
            # outside the sleep is not added to every step; a late loop catches up one step at most.
            now = time.monotonic()
            step = self.token_latency + self.step_per_seq * len(self.running)
            if self.stream_cost and any(seq.tokens is not None for seq in self.running):
                step *= 1.0 + self.stream_cost
            next_step = (next_step if next_step > now - step else now) + step
            await asyncio.sleep(max(0.0, next_step - time.monotonic()))
            self.steps += 1
            still = []
            for seq in self.running:
                if seq.future.done():  # cancelled while running: its slot frees now
                    continue
                seq.done += 1
                self.generated += 1
                if seq.tokens is not None:
                    seq.tokens.put_nowait(seq.done)
                if seq.done >= seq.target:
                    seq.future.set_result(seq.done)
                    self.finished += 1
                else:
                    still.append(seq)
            self.running = still


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error", "code": status}},
                             status=status)


def _text(n: int) -> str:
    return " ".join(_WORDS[i % len(_WORDS)] for i in range(n))


#: Metric names by dialect: (running, waiting, generated tokens).
_NAMES = {"vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:generation_tokens_total"),
          "sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:generation_tokens_total"),
          "llamacpp": ("llamacpp:requests_processing", "llamacpp:requests_deferred",
                       "llamacpp:tokens_predicted_total")}
DIALECTS = ("vllm", "sglang", "llamacpp", "transformers")
#: KV tokens the simulated engines publish (vLLM's blocks of 16, SGLang's token capacity).
KV_TOKENS = 262_144
#: A context per slot for llama-server's /props.
N_CTX = 4096


def build_app(engine: SimEngine, *, model: str, output_tokens: int, metrics_on: bool = True,
              dialect: str = "vllm", dev_mode: bool = False) -> web.Application:
    """The aiohttp application serving ``engine`` in ``dialect`` (see the module docstring)."""
    if dialect not in DIALECTS:
        raise ValueError(f"dialect must be one of {', '.join(DIALECTS)}")
    metrics_on = metrics_on and dialect != "transformers"

    async def _request(request: web.Request, chat: bool) -> web.Response:
        try:
            body = json.loads(await request.read())
        except ValueError:
            return _error(400, "the body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "the body is not a JSON object")
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens", 16))
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            return _error(400, f"max_tokens must be an integer >= 1 (got {max_tokens!r})")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return _error(400, "messages must be a non-empty list")
            words = sum(len(str(m.get("content", "")).split()) for m in messages if isinstance(m, dict))
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                return _error(400, "prompt must be a string")
            words = len(prompt.split())
        prompt_tokens = max(1, words)
        want = max_tokens if output_tokens <= 0 else min(max_tokens, output_tokens)
        if body.get("stream") is True:
            options = body.get("stream_options")
            usage = isinstance(options, dict) and options.get("include_usage") is True
            return await _stream(request, prompt_tokens, want, chat, usage)
        n = await engine.generate(prompt_tokens, want)
        finish = "length" if n >= max_tokens else "stop"
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": _text(n)},
                      "finish_reason": finish, "logprobs": None}
            doc = {"id": f"chatcmpl-sim-{engine.finished}", "object": "chat.completion", "created": int(time.time()),
                   "model": model, "choices": [choice], "usage": usage}
        else:
            choice = {"index": 0, "text": " " + _text(n), "finish_reason": finish, "logprobs": None}
            doc = {"id": f"cmpl-sim-{engine.finished}", "object": "text_completion", "created": int(time.time()),
                   "model": model, "choices": [choice], "usage": usage}
        return web.Response(body=json.dumps(doc).encode(), content_type="application/json")

    async def _stream(request: web.Request, prompt_tokens: int, want: int, chat: bool,
                      usage: bool = False) -> web.StreamResponse:
        """``stream: true``: one server-sent event per token as its step ends, then (with
        ``stream_options.include_usage``, as vLLM) one with ``usage`` and no choices, then ``[DONE]``."""
        tokens: asyncio.Queue[int] = asyncio.Queue()
        job = asyncio.ensure_future(engine.generate(prompt_tokens, want, tokens))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            done = 0
            while done < want:
                done = await tokens.get()
                word = _WORDS[(done - 1) % len(_WORDS)]
                delta = {"content": (" " if done > 1 else "") + word}
                choice = {"index": 0, "delta": delta, "finish_reason": "length" if done >= want else None} if chat \
                    else {"index": 0, "text": " " + word, "finish_reason": "length" if done >= want else None}
                chunk = {"id": "sim-stream", "object": "chat.completion.chunk" if chat else "text_completion",
                         "model": model, "choices": [choice]}
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            if usage:
                counts = {"prompt_tokens": prompt_tokens, "completion_tokens": want,
                          "total_tokens": prompt_tokens + want}
                await resp.write(b"data: " + json.dumps({"id": "sim-stream", "model": model, "choices": [],
                                                         "usage": counts}).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await job
        except ConnectionResetError:  # the client went away mid-stream (aiohttp's reset error is one)
            pass
        finally:
            job.cancel()  # a client gone mid-stream frees its slot
        return resp

    async def chat(request: web.Request) -> web.Response:
        return await _request(request, chat=True)

    async def completions(request: web.Request) -> web.Response:
        return await _request(request, chat=False)

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": model, "object": "model", "owned_by": "sim"}]})

    async def health(request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def metrics(request: web.Request) -> web.Response:
        if not metrics_on:
            return web.Response(status=404)
        label = f'{{model_name="{model}"}}'
        running = sum(1 for s in engine.running if not s.future.done())
        waiting = sum(1 for s in engine.waiting if not s.future.done())
        run_name, wait_name, gen_name = _NAMES[dialect]
        text = (
            f"# TYPE {run_name} gauge\n{run_name}{label} {float(running)}\n"
            f"# TYPE {wait_name} gauge\n{wait_name}{label} {float(waiting)}\n"
            f"# TYPE {gen_name} counter\n{gen_name}{label} {float(engine.generated)}\n"
            "# TYPE sim:steps_total counter\n"
            f"sim:steps_total {float(engine.steps)}\n"
        )
        if dialect == "vllm":
            # vLLM 0.32 (v1/metrics/loggers.py log_metrics_info): CacheConfig's fields as labels of a
            # gauge set to 1; num_gpu_blocks x block_size is its KV capacity in tokens.
            text += (
                "# TYPE vllm:prompt_tokens_total counter\n"
                f"vllm:prompt_tokens_total{label} {float(engine.prompt_tokens)}\n"
                "# TYPE vllm:request_success_total counter\n"
                f"vllm:request_success_total{label} {float(engine.finished)}\n"
                "# TYPE vllm:cache_config_info gauge\n"
                f'vllm:cache_config_info{{block_size="16",engine="0",gpu_memory_utilization="0.92",'
                f'num_gpu_blocks="{KV_TOKENS // 16}"}} 1.0\n'
            )
        return web.Response(text=text, content_type="text/plain")

    async def server_info(request: web.Request) -> web.Response:
        if dialect == "vllm":  # only in its development mode, and only the JSON form carries numbers
            if request.query.get("config_format") != "json":
                return web.json_response({"vllm_config": f"max_num_seqs={engine.max_batch}", "vllm_env": {}})
            return web.json_response({"vllm_config": {"scheduler_config": {"max_num_seqs": engine.max_batch},
                                                      "cache_config": {"block_size": 16}}, "vllm_env": {}})
        # SGLang 0.5.23 (srt/entrypoints/http_server.py server_info): the resolved server args, the
        # scheduler's init info, and one internal state per data-parallel rank.
        return web.json_response({"model_path": model, "max_running_requests": engine.max_batch, "dp_size": 1,
                                  "max_total_num_tokens": KV_TOKENS, "max_req_input_len": N_CTX - 1,
                                  "internal_states": [{"effective_max_running_requests_per_dp": engine.max_batch,
                                                       "last_gen_throughput": 0.0}],
                                  "version": "0.5.23", "frontend": "python"})

    async def props(request: web.Request) -> web.Response:
        # llama-server (tools/server/server.cpp, GET /props): slots and the context of one.
        return web.json_response({"default_generation_settings": {"n_ctx": N_CTX, "params": {}},
                                  "total_slots": engine.max_batch, "model_path": f"/models/{model}.gguf",
                                  "build_info": "b11434-sim"})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    if dialect == "sglang" or (dialect == "vllm" and dev_mode):
        app.router.add_get("/server_info", server_info)
    if dialect == "sglang":
        app.router.add_get("/get_server_info", server_info)
    if dialect == "llamacpp":
        app.router.add_get("/props", props)
    return app


def parse_metrics(text: str) -> dict[str, float]:
    """Sample name (labels dropped) -> value, summed over label sets: enough to read this server's
    own ``/metrics`` back in benchmarks and tests."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        name = name.split("{", 1)[0]
        out[name] = out.get(name, 0.0) + float(value)
    return out


async def serve(args: argparse.Namespace) -> None:
    engine = SimEngine(args.token_latency, args.max_batch, args.step_per_seq, args.stream_cost, args.prefill)
    print(f"engine: step {args.token_latency} s + {args.step_per_seq} s per running request, batch "
          f"{args.max_batch}, prefill {args.prefill} s, dialect {args.dialect}"
          + (", no /metrics" if args.no_metrics or args.dialect == "transformers" else ""), file=sys.stderr)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    runner = web.AppRunner(build_app(engine, model=args.model, output_tokens=args.output_tokens,
                                        metrics_on=not args.no_metrics, dialect=args.dialect,
                                        dev_mode=args.dev_mode), access_log=None,
                            shutdown_timeout=1.0)  # SIGTERM with requests open: gone in a second, as an engine
    await runner.setup()
    site = web.SockSite(runner, sock, backlog=1024)
    await site.start()
    scheduler = asyncio.create_task(engine.loop())
    host, port = sock.getsockname()[:2]
    print(f"listening on {host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        scheduler.cancel()
        await runner.cleanup()


#: Measured engines' curves (see the module docstring).
PRESETS: dict[str, dict[str, float | int | str]] = {
    "transformers-h100": {"token_latency": 0.11115, "step_per_seq": 0.0000914, "prefill": 0.27,
                          "max_batch": 1024, "dialect": "transformers"},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, a ``--preset`` applied over it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = let the OS choose; the port is printed")
    parser.add_argument("--token-latency", type=float, default=0.02, help="seconds per decode step (whole batch)")
    parser.add_argument("--max-batch", type=int, default=16, help="requests decoded at once; the rest wait")
    parser.add_argument("--output-tokens", type=int, default=0,
                        help="tokens a request generates when max_tokens allows more (0: always max_tokens)")
    parser.add_argument("--model", default="sim-model", help="the served model name")
    parser.add_argument("--step-per-seq", type=float, default=0.0,
                        help="seconds a decode step grows per running request (a GPU's batch cost)")
    parser.add_argument("--no-metrics", action="store_true", help="answer /metrics with 404")
    parser.add_argument("--stream-cost", type=float, default=0.0,
                        help="extra share of every step while a streamed request runs (0.55: transformers "
                             "serve on the H200)")
    parser.add_argument("--prefill", type=float, default=0.0,
                        help="seconds each request waits before joining the batch (its time to first token is "
                             "this plus up to one step)")
    parser.add_argument("--dialect", choices=DIALECTS, default="vllm",
                        help="the engine whose capacity endpoints and metric names it speaks (transformers: none)")
    parser.add_argument("--dev-mode", action="store_true",
                        help="--dialect vllm: answer GET /server_info as vLLM's development mode does")
    parser.add_argument("--preset", choices=tuple(PRESETS),
                        help="a measured engine's curve: the defaults of --token-latency, --step-per-seq, --prefill, "
                             "--max-batch and --dialect (a flag given too wins)")
    preset = parser.parse_known_args(argv)[0].preset
    if preset:
        parser.set_defaults(**PRESETS[preset])
    args = parser.parse_args(argv)
    if args.token_latency <= 0 or args.max_batch < 1:
        parser.error("--token-latency must be > 0 and --max-batch >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    asyncio.run(serve(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
