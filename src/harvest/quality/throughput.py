"""The throughput probe of a tune trial: a fixed sample of the job's prompts at saturating concurrency.

    result = await throughput_probe(server_config, prompts, settings, sampling=job.sampling,
                                    metrics=adapter.metrics, kv_capacity=server.kv_capacity_tokens)

Every prompt is sent through harvest's own client as a chat completion (the path the campaign
uses), all at once up to ``concurrency``. Measured: generation tokens per second from the answers'
``usage`` over the wall time, the same from the engine's ``generation_tokens_total`` counter
(``/metrics`` before and after), the peak of the running and waiting gauges (``/metrics`` polled
every ``metrics_interval`` s; only a reading asked for after the requests went out and back before
the last answer counts: a busy vLLM CPU server answered a scrape sent mid-run only once the run had
drained, with 0 running. No such reading: None, unknown, not 0), and failed requests. The KV
capacity is what the adapter read at launch. An engine without ``/metrics`` gets usage-based figures only.

This module only sends requests; it never launches or stops a server.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from harvest.client import Client
from harvest.config import ClientConfig, SamplingConfig, ServerConfig
from harvest.errors import RequestError
from harvest.quality.probe import ProbePrompt
from harvest.server.base import MetricNames


class ThroughputSettings(BaseModel):
    """``[throughput]`` of a tune file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Prompts of the sample, drawn from the job's dataset by a seeded hash (as the probe set is).
    prompts: int = Field(64, ge=1)
    seed: int = 1
    #: Requests in flight at once: set it above what the server can run, so the server saturates.
    concurrency: int = Field(64, ge=1)
    #: max_tokens of each request (default: the job's [sampling] max_tokens).
    max_tokens: int | None = Field(None, ge=1)
    #: Extra request fields (e.g. ``{ignore_eos = true}`` on vLLM/SGLang so every answer is full length).
    extra_body: dict[str, Any] = Field(default_factory=dict)
    metrics_interval: float = Field(0.5, gt=0)
    request_timeout: float = Field(600.0, gt=0)


@dataclass(frozen=True)
class ThroughputResult:
    """What one throughput probe measured."""

    requests: int
    failed: int
    wall_s: float
    prompt_tokens: int
    completion_tokens: int
    #: Generation tokens per second from the answers' usage.
    gen_tok_s: float
    #: The same from the engine's generation-token counter (None without /metrics).
    gen_tok_s_metrics: float | None
    #: Peaks of the engine's gauges while the requests ran; None: no /metrics, or no scrape came back
    #: while they ran.
    peak_running: int | None
    peak_waiting: int | None
    kv_capacity_tokens: int | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def _poll_gauges(client: Client, metrics: MetricNames, interval: float, peaks: dict[str, float],
                       sent: asyncio.Event, stop: asyncio.Event) -> None:
    """Scrape every ``interval`` s until ``stop``; keep the peaks of readings asked for once the
    requests were ``sent`` and back before ``stop`` (the last answer)."""
    while True:
        during = sent.is_set()
        scraped = await client.scrape_metrics()
        if not during or stop.is_set():
            scraped = {}  # before the load, or answered after it drained: says nothing of the run
        for values in scraped.values():
            for key, name in (("running", metrics.running), ("waiting", metrics.waiting)):
                if name and name in values:
                    peaks[key] = max(peaks.get(key, 0.0), values[name])
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
        if stop.is_set():
            return


def _counter(scraped: dict[str, dict[str, float]], name: str | None) -> float | None:
    if not name:
        return None
    values = [v[name] for v in scraped.values() if name in v]
    return sum(values) if values else None


async def throughput_probe(server: ServerConfig, prompts: Sequence[ProbePrompt],
                           settings: ThroughputSettings, *,
                           sampling: SamplingConfig | None = None, metrics: MetricNames | None = None,
                           kv_capacity: int | None = None) -> ThroughputResult:
    """Send ``prompts`` at ``settings.concurrency`` and measure; ServerSick propagates."""
    sampling = sampling or SamplingConfig()
    if settings.max_tokens is not None:
        sampling = sampling.model_copy(update={"max_tokens": settings.max_tokens})
    if settings.extra_body:
        sampling = sampling.model_copy(update={"extra_body": {**sampling.extra_body, **settings.extra_body}})
    client_config = ClientConfig(concurrency=settings.concurrency, request_timeout=settings.request_timeout,
                                 max_retries=1, health_deadline=min(120.0, settings.request_timeout))
    metrics = metrics or MetricNames(metrics_path=None)
    scrape = metrics.metrics_path is not None
    model = server.served_model_name or server.model
    async with Client([server.url], client_config, sampling, api_key=server.api_key(), model=model) as client:
        before = await client.scrape_metrics() if scrape else {}
        peaks: dict[str, float] = {}
        sent, stop = asyncio.Event(), asyncio.Event()
        poller = asyncio.create_task(_poll_gauges(client, metrics, settings.metrics_interval, peaks, sent, stop)) \
            if scrape and (metrics.running or metrics.waiting) else None
        failed = 0
        prompt_tokens = completion_tokens = 0

        async def one(p: ProbePrompt) -> None:
            nonlocal failed, prompt_tokens, completion_tokens
            try:
                done = await client.chat(p.as_messages())
            except RequestError:
                failed += 1
                return
            prompt_tokens += done.prompt_tokens or 0
            completion_tokens += done.completion_tokens or 0

        t0 = time.perf_counter()
        try:
            requests = [asyncio.ensure_future(one(p)) for p in prompts]
            await asyncio.sleep(0)  # each request has started: it waits for a slot or is on its way
            sent.set()
            await asyncio.gather(*requests)
        finally:
            wall = time.perf_counter() - t0
            stop.set()
            if poller is not None:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(poller, settings.metrics_interval + 15.0)
        after = await client.scrape_metrics() if scrape else {}
    counter = metrics.generation_tokens_total
    gen_before, gen_after = _counter(before, counter), _counter(after, counter)
    by_metrics = None
    if gen_before is not None and gen_after is not None and wall > 0:
        by_metrics = (gen_after - gen_before) / wall
    return ThroughputResult(
        requests=len(prompts), failed=failed, wall_s=round(wall, 3), prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        gen_tok_s=round(completion_tokens / wall, 2) if wall > 0 else 0.0,
        gen_tok_s_metrics=round(by_metrics, 2) if by_metrics is not None else None,
        peak_running=int(peaks["running"]) if "running" in peaks else None,
        peak_waiting=int(peaks["waiting"]) if "waiting" in peaks else None,
        kv_capacity_tokens=kv_capacity)


__all__ = ["ThroughputResult", "ThroughputSettings", "throughput_probe"]
