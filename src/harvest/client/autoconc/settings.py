"""The auto-concurrency controller's knobs (:class:`AutoSettings`), what one control step decided
(:class:`Decision`), and where an endpoint's target starts (:func:`start_for`). Values only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class AutoSettings:
    """The controller's knobs. ``start`` and ``max_concurrency`` come from ``[client]``."""

    start: int = 64
    max_concurrency: int = 1024
    #: Seconds between control steps (with gauges: between scrapes).
    interval_s: float = 1.0
    #: Relative tok/s growth that counts as "it grew" (below: noise).
    gain: float = 0.05
    #: Settle on the smallest level whose tok/s is within this share of the best seen.
    settle_within: float = 0.05
    #: Growth factor of a step while starting.
    increase: float = 2.0
    #: Factor of a probe upwards once settled.
    probe: float = 1.25
    #: Steps between two probes once settled.
    probe_every: int = 8
    #: Factor of a back-off without a measured capacity.
    decrease: float = 0.7
    #: KV-cache use at which the engine counts as full.
    kv_high: float = 0.95
    #: Queued requests tolerated: max(2, this x running).
    queue_slack: float = 0.125
    #: Latency per output token this many times the accepted level's counts as a rise.
    latency_rise: float = 1.5
    #: Without a token counter, a step lasts until ``max(4, target / 2)`` answers came back, or
    #: this many intervals.
    max_wait_steps: int = 10
    #: With gauges: scrapes whose running count make up "what the engine ran at most".
    peak_window: int = 5
    #: With gauges: scrapes after a preemption during which growth stays below where it happened.
    ceiling_steps: int = 30
    #: The engine's hard cap on requests running at once, when harvest knows it exactly (it launched
    #: every endpoint with it: ``server/batch.py``). With gauges the target then stops at it plus a
    #: short queue: more in flight could only wait in the engine's queue.
    engine_limit: int | None = None
    #: The engine's batch limit as harvest knows it, exact or an upper bound (transformers' 1024
    #: requests per batch, which KV memory may lower): below it a canary needs no place of its own.
    batch_hint: int | None = None
    #: With a canary, once settled: the most of the time since the endpoint's first step the canary
    #: may have run before it reads a level again for a look up. A look looks for ``gain`` (5 %);
    #: while a canary streams, transformers serve on the H200 made about a third fewer tokens, so
    #: canaries at this share cost under 2 % of the tok/s, less than a look can find.
    canary_share: float = 0.05
    #: Why ``start`` is where it is, in words: the level's reason until the first move ("engine
    #: capacity 4 from /props"; the panel and ``status --json`` show it).
    origin: str = ""

    def __post_init__(self) -> None:
        if not 1 <= self.start <= self.max_concurrency:
            raise ValueError(f"start {self.start} must be between 1 and max_concurrency {self.max_concurrency}")
        if not 0 < self.canary_share <= 1:
            raise ValueError("canary_share must be in (0, 1]")
        if self.interval_s <= 0 or self.gain <= 0 or self.increase <= 1 or self.probe <= 1:
            raise ValueError("interval_s and gain must be > 0, increase and probe > 1")
        if not 0 < self.decrease < 1 or not 0 < self.kv_high <= 1:
            raise ValueError("decrease must be in (0, 1), kv_high in (0, 1]")


@dataclass(frozen=True)
class Decision:
    """What one control step decided, for the display, status --json and tests."""

    target: int
    #: "start" (growing), "settled", "probe", "backoff" or "restart".
    phase: str
    #: Why it moved (or "hold"): "tok/s grew", "no gain", "queue", "kv full", "preemption", "latency", ...
    reason: str
    #: Generation tok/s measured over the step; None when nothing was measured.
    tok_s: float | None = None
    #: Whether the engine's /metrics fed the step.
    gauges: bool = False


#: The first target of an endpoint whose engine publishes nothing of its size and has no /metrics
#: (``transformers serve`` harvest did not launch, an unknown OpenAI-compatible server): the largest
#: batch an engine harvest knows runs by default (transformers' 1024 requests per batch; vLLM's
#: ``max_num_seqs`` on an H100 or H200). Requests an engine cannot run yet wait in its queue at
#: little cost to its tok/s, where a start below its best level costs a whole wave of answers at
#: each step up: on an H100 (2026-12-06) the default started at 64 made x0.41-0.64 the tok/s of
#: fixed 512 over 1024 requests; the canary, within its share of the time, brings the level down
#: where the engine queues (BENCHMARKS.md, "P7 on an endpoint harvest did not launch").
UNKNOWN_START = 1024


def start_for(limit: int | None, *, metrics: bool, max_concurrency: int, fallback: int = 64,
              exact: bool = False) -> int:
    """The first target of an endpoint: the engine's batch limit when harvest knows it (it launched
    the engine, or the engine publishes it: :mod:`harvest.client.capacity`); unknown, ``fallback``
    for an engine with /metrics (its gauges find the level within seconds) and :data:`UNKNOWN_START`
    for one without; within [1, ``max_concurrency``].

    A limit known ``exact`` on an engine with /metrics starts where the controller would settle at
    once: the batch plus a short queue (``AutoSettings.queue_slack``), so the batch is full from the
    first answer on (vLLM CPU's 128: 144, one step sooner; a run of 20 s noticed the step).

    An engine without /metrics starts at its limit too. It was started at half (sent its full batch,
    only latency an answer later would say whether that overshot what it really runs at once), but
    with answers of equal length a run is a train of waves of the level: a start below the best level
    reaches it a wave late at the soonest, and a short run never pays that back. On an H100
    (2026-12-06) transformers' 1024 made x1.21 the tok/s of 512 and the default held 512 (x0.81 of
    1024); on its simulation a start at 512 made x0.84, a start at 1024 x0.994 (2048 x 64) and x0.988
    (4096 x 64) of fixed 1024 (BENCHMARKS.md, P7 A1). Where the engine runs fewer than its limit at
    once (KV memory, the step's token budget), the canary, which takes a place at the limit and reads
    within its share of the time, waits behind the queue and the level comes down
    (``AutoConcurrency._waited``).
    """
    start = limit if limit is not None else fallback if metrics else UNKNOWN_START
    if limit is not None and metrics and exact:
        start = limit + max(2, math.ceil(AutoSettings.queue_slack * limit))
    return max(1, min(start, max_concurrency))


__all__ = ["UNKNOWN_START", "AutoSettings", "Decision", "start_for"]
