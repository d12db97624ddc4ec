"""What the controller is fed besides answers: one scrape of an engine's /metrics (:class:`Gauges`)
and one canary (:class:`Canary`). Records only; reading them is the client's job
(:mod:`harvest.client.steer`, :mod:`harvest.client.canary`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

#: Metric names by meaning, first present wins (vLLM, SGLang, llama-server).
RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing")
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred")
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage",
            "llamacpp:kv_cache_usage_ratio")
PREEMPTIONS = ("vllm:num_preemptions_total", "sglang:num_retracted_reqs_total")
GENERATED = ("vllm:generation_tokens_total", "sglang:generation_tokens_total", "llamacpp:tokens_predicted_total")
#: Every name the controller reads (the scrape parses only these lines).
GAUGE_NAMES = frozenset(RUNNING + WAITING + KV_USAGE + PREEMPTIONS + GENERATED)


@dataclass(frozen=True)
class Gauges:
    """One scrape of an engine's /metrics, by meaning; None where the engine has no such metric."""

    running: float | None = None
    waiting: float | None = None
    #: KV-cache use, 0..1.
    kv_usage: float | None = None
    #: Cumulative preemptions (a counter).
    preemptions: float | None = None
    #: Cumulative generated tokens (a counter).
    generated: float | None = None

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, float]) -> Gauges | None:
        """The gauges in a scrape summed by name (:func:`~harvest.client.metrics.scrape_metrics`);
        None when the scrape is empty (no /metrics) or names none of them."""

        def first(names: tuple[str, ...]) -> float | None:
            for name in names:
                value = metrics.get(name)
                if value is not None and not math.isnan(value):
                    return value
            return None

        gauges = cls(first(RUNNING), first(WAITING), first(KV_USAGE), first(PREEMPTIONS), first(GENERATED))
        return None if gauges == cls() else gauges


@dataclass(frozen=True)
class Canary:
    """One small streamed request the steering loop keeps going to an endpoint without /metrics
    (:mod:`harvest.client.canary`): how long it waited for its first token, and the pace of the
    rest, which is the engine's decode step as a request in its batch sees it."""

    #: Clock time it was sent.
    sent_at: float
    #: The client's requests on the endpoint when it was sent.
    outstanding: int
    #: Seconds since it was sent (still going), or until its last token (done).
    age: float
    #: Seconds to its first token; None while none came.
    ttft: float | None = None
    #: Mean seconds between its tokens after the first; None while it runs, or with too few tokens.
    itl: float | None = None
    done: bool = False


def went_back(before: float | None, after: float | None) -> bool:
    """Whether a counter went backwards between two scrapes (the engine restarted)."""
    return before is not None and after is not None and after < before


__all__ = ["GAUGE_NAMES", "GENERATED", "KV_USAGE", "PREEMPTIONS", "RUNNING", "WAITING", "Canary", "Gauges",
           "went_back"]
