"""``concurrency = "auto"``: one controller per endpoint that finds how many requests it can take.

A controller owns one number, the endpoint's *target* (requests in flight it may hold). It starts
from what harvest knows (:func:`start_for`: the batch limit of an engine it launched, vLLM
``max_num_seqs``, SGLang ``max_running_requests``, llama.cpp slots, transformers' requests per
batch) and moves in one of two ways:

**Gauges** (the engine's /metrics has running and waiting): every scrape, not every answer. The
engine's queue is kept short but never empty: while the client keeps the endpoint at its target
(``busy``: its peak outstanding over the step) and the engine runs what it is sent (waiting under
half the slack), the target doubles; once requests wait beyond ``max(2, queue_slack x running)``
two scrapes in a row, the engine is full and the target becomes what it ran at most over the last
``peak_window`` scrapes plus that slack. With a token counter (vLLM, SGLang, llama.cpp) a step up
is kept only if the engine also *makes* more: the mean tok/s of three scrapes at the new level
against three at the one below, tokens over seconds (a CPU engine may run 512 at once and make fewer
tokens than at 64; answers of equal length end in waves that one-second scrapes alias); one that does
not pay goes back and growth waits ``ceiling_steps`` scrapes before another look. When the engine's
cap is known exactly (``engine_limit``: vLLM ``max_num_seqs`` harvest set, its CPU build's 128,
llama.cpp slots), the target starts and stops at that cap plus the short queue: past it only the
queue grows. Unless the engine's queue runs dry there with its batch short (one scrape of the last
``peak_window`` with a token counter, which judges the deepening; two without): what
the client holds and the engine does not yet see is in transit (HTTP, tokenizing, answers on their
way back), and the target grows to twice the cap with a token counter, kept unless it makes fewer
tokens (a queue at an exact cap costs latency, not tokens; with answers of equal length ending in
waves, the next wave must already wait in the engine when one ends: a deepening by the gap paid
nothing measurable where a whole second batch did), else by the deepest gap a dry scrape showed.
Preemptions (KV thrashing) cut the target to ``decrease`` x what ran and cap growth below that level
for a while. Seconds, not answer latencies: a vLLM or SGLang engine admits new requests within one
scheduler step, so the next scrape shows them.

**A canary** (no /metrics, an endpoint that streams: ``transformers serve``, an endpoint of unknown
make; :mod:`harvest.client.canary`): one small streamed request at a time, sent after the requests a
new level lets in. It takes one of the target's places only at or above the engine's batch limit as
harvest knows it (``batch_hint``), or when none is known, or once it waited without one (the real cap
was lower). Two canaries in a row that wait for their first token more than 5 decode steps (half a
second at least), or one that waits twice that, say the engine queues: back to the last level that
showed no queue (or to what the engine runs, from its wait and the answer rate); at a level that
already ran without a queue it takes three in a row (a wave of equal answers refilled at once reaches
the server's front end ahead of the canary). Otherwise requests held / its token pace is the
engine's tok/s at that level (the median of the level's canaries): x2 while that grows by ``gain``
(judged on the mean of two canaries; one that shows no gain sends it back at once), else back and
a ceiling for ``ceiling_steps``; then one look x``probe`` each time the ceiling lifts, against the
median of three fresh canaries at the level, and each look that does not pay doubles the wait for
the next (up to 8 x). A start at half a batch limit harvest knows is such a level from the start:
the first look up is a probe, ``ceiling_steps`` in (with equal answers a canary reads its level
+-40 % by where in a wave it runs; judged in the first seconds, a look up cost a wave whichever way
it went). The canary is not free (transformers serve on the H200 made x0.63-0.65 of fixed 512's
tok/s with one streamed back to back beside it), so it rests while there is nothing to judge: held
or settled under a ceiling, with no wait and no step up pending (:meth:`canary_rests`), and, once
settled, while the next canary would take it past ``canary_share`` (5 %) of the endpoint's time: the
readings for a look up cost less than the 5 % a look looks for (a 45-second run on the H200 lost
12 % to them and to its look above 512, at the same level as fixed 512). A level
shows in a canary or two, seconds, where judging it by its answers takes one answer latency (7-20 s
on an H200 at a big batch).

**Answers alone** (no /metrics and no canary: it does not stream, or the target is under the canary's
minimum), once per control step, in four named steps:

    measure   generation tok/s over the step (the engine's token counter when /metrics has one,
              otherwise the tokens of the answers that came back), latency per output token of
              those answers, and the engine's gauges: running, waiting, KV-cache use, preemptions
    pressure  is the engine past what it can take?  preemptions appeared; KV use >= ``kv_high``;
              the queue is longer than ``queue_slack`` x running; or, for an engine without queue
              gauges only (no /metrics), the median latency per output token rose ``latency_rise`` x
              above the accepted level's without tok/s growing with it, two steps in a row (one
              is noise: a heavy latency tail, newcomers still in prefill)
    decide    under pressure: back off (to what the engine runs plus a little headroom when its
              queue is the reason, to the last level that paid when latency is, else
              x ``decrease``) and remember the level as a ceiling; otherwise, while starting:
              double while tok/s grows by ``gain`` (one step without growth is given the benefit
              of the doubt); then settle on the smallest level within ``settle_within`` of the best tok/s;
              when settled: every ``probe_every`` steps probe one step up, kept only if tok/s grew;
              a probe that paid with no pressure remembered goes back to doubling
    bound     clamp to [1, ``max_concurrency``]

A counter that went backwards (generation tokens, preemptions) means the engine restarted: the
controller forgets what it learnt and starts again from ``start``.

It never does I/O and never reads a clock: the client feeds it answers (:meth:`record`) and,
once per step, the gauges it scraped with the time (:meth:`step`). So a test drives it with a
trace, and the client decides where the numbers come from.
"""

from __future__ import annotations

import math
import statistics
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


@dataclass(frozen=True)
class _Observation:
    tok_s: float | None
    tpot: float | None
    gauges: Gauges | None
    preempted: bool
    restarted: bool


class AutoConcurrency:
    """The controller of one endpoint: see the module docstring."""

    def __init__(self, settings: AutoSettings | None = None):
        self.settings = settings or AutoSettings()
        self._reset(self.settings.start)
        self._last_gauges: Gauges | None = None
        self.last = Decision(self.target, "start", "initial")

    @property
    def seen(self) -> Gauges | None:
        """The gauges of the last scrape that reached a step (None: none yet)."""
        return self._seen

    # --- feeding --------------------------------------------------------------------------------

    def record(self, completion_tokens: int | None, latency_s: float) -> None:
        """One answer from this endpoint: its generated tokens and its latency."""
        tokens = max(int(completion_tokens or 0), 0)
        self._tokens += tokens
        self._answers += 1
        self._paced_answers += 1
        if tokens > 0 and latency_s > 0 and len(self._tpots_now) < _TPOT_SAMPLE:
            self._tpots_now.append(latency_s / tokens)
        if latency_s > 0 and len(self._latencies_now) < _TPOT_SAMPLE:
            self._latencies_now.append(latency_s)

    def step(self, now: float, gauges: Gauges | None = None, *, busy: bool | None = None,
             canary: Canary | None = None, paced: bool = False) -> Decision:
        """One control step at clock time ``now`` with this step's scrape (None: no /metrics).
        ``busy``: whether the client held (nearly) the target on the endpoint during the step (None:
        judged from the gauges, running + waiting against the target). ``paced``: an endpoint
        without queue gauges steered by a canary, ``canary`` its latest (None: none yet)."""
        if gauges is not None and gauges.running is not None and gauges.waiting is not None:
            return self._fill(now, gauges, busy)
        if gauges is None and self._fill_prev is not None and not paced:
            # A scrape that did not come back (a busy engine answers /metrics late): no verdict, and
            # not a switch to judging by answers, whose windows this mode never kept.
            return self.last
        if paced or canary is not None:
            self._held_start()
            self._count_canary(now, canary)
            if canary is None:
                if self.canary_rests():
                    # Nothing to judge until the ceiling lifts: the canary rests, the ceiling ages.
                    lifting = self._ceiling_left == 1
                    self._age_ceiling()
                    if lifting:
                        self._level_readings = []  # the level is read afresh before a look up
                    return self._hold("hold", "settled")
                return self._hold("measuring", self.last.phase)
            return self._paced(now, canary, busy is not False)
        obs = self._measure(now, gauges)
        if obs is None:
            return self.last
        if obs.restarted:
            self._reset(min(self.target, self.settings.start))
            self._mark(now, gauges)
            self.last = Decision(self.target, "restart", "engine counters reset", None, True)
            return self.last
        pressure = self._pressure(obs)
        target, phase, reason = self._decide(obs, pressure)
        before, self.target = self.target, self._bound(target)
        self._warming = self.target != before
        self.last = Decision(self.target, phase, reason, obs.tok_s, obs.gauges is not None)
        return self.last


    # --- with gauges: every scrape ----------------------------------------------------------------

    def _fill(self, now: float, g: Gauges, busy: bool | None) -> Decision:
        """One scrape of an engine with queue gauges: keep its queue short but never empty."""
        s = self.settings
        prev, self._fill_prev = self._fill_prev, (now, g)
        self._seen = g
        tok_s = None
        preempted = restarted = False
        if prev is not None:
            before_t, before = prev
            restarted = _went_back(before.generated, g.generated) or _went_back(before.preemptions, g.preemptions)
            if g.generated is not None and before.generated is not None and now > before_t and not restarted:
                tok_s = (g.generated - before.generated) / (now - before_t)
            preempted = not restarted and g.preemptions is not None and before.preemptions is not None \
                and g.preemptions > before.preemptions
        if restarted:
            self._reset(min(self.target, self.settings.start))
            self._fill_prev = (now, g)
            self.last = Decision(self.target, "restart", "engine counters reset", None, True)
            return self.last
        running, waiting = float(g.running or 0.0), float(g.waiting or 0.0)
        self._peaks.append(running)
        del self._peaks[:-s.peak_window]
        peak = max(self._peaks)
        slack = max(2.0, math.ceil(s.queue_slack * peak))
        self._age_ceiling()
        # The queue a deepening at an exact cap allows for (``_transit``) is on purpose, not a queue.
        self._queued = self._queued + 1 if waiting > slack + self._transit else 0
        self._empty = self._empty + 1 if waiting == 0 else 0
        if tok_s is not None:
            if self._settling:  # the scrape right after a change: newcomers still in prefill
                self._settling -= 1
            else:
                self._rates.append(tok_s)
                del self._rates[:-s.peak_window]
        target: float = self.target
        #: With an exact engine limit: where the target stops (its batch, a short queue, and what is
        #: on its way between the client and the engine's scheduler: ``_transit``).
        full = None
        if s.engine_limit is not None:
            full = s.engine_limit + max(2, math.ceil(s.queue_slack * s.engine_limit)) + self._transit
            # Dry: the client holds its target, the engine's queue is empty and its batch not full.
            # What the client holds and the engine does not see is in transit (its HTTP server,
            # tokenizing, answers being sent back): measured on vLLM CPU, 144 in flight kept its
            # 128-request batch short and fixed 256 made x1.28 the tok/s of fixed 128.
            dry = self.target >= full and busy is not False and waiting == 0 and running < 0.9 * s.engine_limit
            self._dry.append(running if dry else None)
            del self._dry[:-s.peak_window]
        trial = self._judge_trial(preempted)
        if trial is not None:
            target, phase, reason = trial
        elif preempted:
            target = max(1.0, min(self.target, running) * s.decrease)
            self._ceiling, self._ceiling_left = max(1, int(min(self.target, running))), s.ceiling_steps
            phase, reason = "backoff", "preemption"
        elif self._queued >= 2:
            # Full: it runs ``peak`` at most and queues the rest. A short queue, never an empty one.
            # Queued past what a deepening allowed for: less is in transit than it measured.
            self._transit = max(0, self._transit - int(waiting - slack - self._transit))
            target = peak + slack + self._transit
            phase, reason = "settled", "queue"
        elif g.kv_usage is not None and g.kv_usage >= s.kv_high:
            phase, reason = "settled", "kv full"
        elif full is not None and (g.generated is None or len(self._rates) >= _DEEPEN_BASE) \
                and (deeper := self._deeper(full, counter=g.generated is not None)) is not None:
            # It starts at the first dry scrape with a rate: each second at the cap cost a quarter
            # of the tok/s on vLLM CPU (A2: the deepening came 4-6 s into runs of 17-20 s). With a
            # token counter it is judged (kept unless it makes fewer tokens) only against as many
            # scrapes of this level as judge the new one: one scrape of waves of equal answers read
            # 8445 and 7112 tok/s where the level made about 7000, and took back a deepening that
            # paid (BENCHMARKS P7 A2, vLLM CPU). Unjudged it costs latency, not tokens.
            before_transit = self._transit
            self._transit += deeper - full
            target, phase, reason = deeper, "start", "engine's queue ran dry at its batch limit"
            if g.generated is not None and len(self._rates) >= _TRIAL_SCRAPES:
                self._trial = (self.target, statistics.fmean(self._rates[-_TRIAL_SCRAPES:]))
                self._trial_transit = before_transit
        elif (busy if busy is not None else running + waiting >= 0.9 * self.target) and \
                waiting < max(1.0, slack / 2) and (peak >= 0.8 * self.target or self._empty >= 3):
            # It ran 80 % of what it was sent in a recent scrape (or its queue read empty three
            # scrapes in a row: the rest are in transit, in its HTTP server or on their way back, as
            # on a CPU-starved vLLM at load 20), its queue is under half the slack (the queue kept at
            # the slack on purpose does not count), and we keep it busy: there may be room above.
            # One scrape's empty queue alone is no proof (seen on a 4-sequence vLLM: between two
            # answers its queue reads 0 while it runs its 4).
            up = self.target * s.increase
            if self._ceiling is not None:
                up = min(up, max(self.target, self._ceiling - 1))
            target, phase, reason = up, "start", "engine takes more"
            if full is not None and up >= full:
                # It runs its whole batch: past it only its queue grows. A short one, never empty.
                target, phase, reason = max(self.target, full), "settled", "at the engine's batch limit"
            elif up <= self.target:  # a step up that gave nothing, not long ago
                target, phase, reason = self.target, "settled", "hold"
            elif self._trial is not None:
                target, phase, reason = self.target, "start", "measuring"
            elif g.generated is not None:
                # The engine takes more, but does it make more? With a token counter a level shows
                # in seconds: judge the step up on tok/s against this level's (vLLM CPU ran 512 at
                # once with no queue at x0.63 of the tok/s of 64).
                if len(self._rates) < _TRIAL_SCRAPES:
                    target, phase, reason = self.target, "start", "measuring"
                else:
                    self._trial = (self.target, statistics.fmean(self._rates[-_TRIAL_SCRAPES:]))
        elif self._queued or (waiting >= max(1.0, slack / 2)
                              and (busy if busy is not None else running + waiting >= 0.9 * self.target)):
            # Kept busy with a queue of its own (at the slack, on purpose), or queued past it once:
            # full, hold. Kept busy with no queue but running fewer: the rest is in transit.
            phase, reason = "settled", "hold"
        else:  # the client does not keep it at its target (too few items, fast answers): no verdict
            phase, reason = self.last.phase, "not filled"
        if full is not None and self.target >= full and reason in ("hold", "not filled"):
            phase, reason = "settled", "at the engine's batch limit"
        before, self.target = self.target, self._bound(target)
        if phase == "start" and target > self.target:  # it would take more than max_concurrency allows
            phase, reason = "settled", "at max_concurrency"
        if self.target != before:
            self._rates, self._settling = [], 1
        if self._trial is not None and self.target <= self._trial[0]:
            self._trial, self._trial_transit = None, None  # backed off or bounded: nothing left to judge
        self.last = Decision(self.target, phase, reason, tok_s, True)
        return self.last

    def _judge_trial(self, preempted: bool) -> tuple[float, str, str] | None:
        """A step up under judgement (gauges with a token counter): once the new level has
        ``_TRIAL_SCRAPES`` scrapes of tok/s, keep it if it made ``gain`` more than the level below,
        else go back there and cap growth below the level tried for ``ceiling_steps`` scrapes.
        None when no step is being judged, or the judging goes on (the other rules decide)."""
        if self._trial is None or preempted or len(self._rates) < _TRIAL_SCRAPES:
            return None
        s = self.settings
        base, base_tok_s = self._trial
        self._trial = None
        # A deeper queue at an exact cap cannot make the engine run more at once, only keep its
        # batch full between waves, and vLLM's waiting requests hold no KV: it costs latency, not
        # tokens. So it stays unless it makes fewer tokens (``gain`` less). Judged to pay ``gain``
        # like a step up, it read "no gain" in half the A2 rounds where fixed 256 made x1.19-1.88
        # the tok/s of 128 (three one-second scrapes of waves of equal answers are that noisy).
        deepening = self._trial_transit is not None
        bar = base_tok_s * (1 - s.gain) if deepening else base_tok_s * (1 + s.gain)
        if statistics.fmean(self._rates[-_TRIAL_SCRAPES:]) >= bar:
            self._trial_transit = None
            return None  # it paid: the usual rules (grow again, hold, queue) go on from here
        # No growth above ``base`` for a while; then one more look (the engine or the work changes).
        self._ceiling, self._ceiling_left = base + 1, s.ceiling_steps
        if deepening:  # a deeper queue that cost tokens: back to the old one
            self._transit, self._trial_transit = self._trial_transit, None
            return float(base), "settled", "fewer tokens"
        return float(base), "settled", "no gain"

    def _deeper(self, full: int, *, counter: bool) -> int | None:
        """With an exact engine limit: a deeper target when the engine's queue ran dry in one (with a
        token counter, which judges it) or two of the last scrapes at ``full`` (its batch short by
        what is in transit), else None. With a token counter it is twice the limit, a whole second
        batch, kept unless it makes fewer tokens: with equal-length answers, which end in waves, the next wave
        must already be in the engine when the current one ends (on vLLM CPU fixed 256 made
        x1.1-1.4 the tok/s of fixed 128, its cap, where growing by the gap, to 175 or 223, read "no
        gain"); a steady flow short by what is in transit pays for it too, at a queue of up to one
        batch. Without a counter nothing would take it back: it grows by the deepest gap a dry
        scrape showed (what is in transit), up to twice the limit."""
        limit = self.settings.engine_limit
        dry = [r for r in self._dry if r is not None]
        # With a token counter the deepening is a trial (taken back if it costs): one dry scrape
        # starts it. Without one nothing would take it back: two.
        if limit is None or len(dry) < (1 if counter else 2) or full >= 2 * limit or (
                self._ceiling is not None and full + 1 >= self._ceiling):
            return None
        self._dry.clear()
        if counter:
            # Judged, so straight to a second batch: a deepening by the gap (to 223, and to 175 in
            # another run) read "no gain" on vLLM CPU where fixed 256 made x1.26-1.43 of fixed 128.
            return 2 * limit
        slack = max(2, math.ceil(self.settings.queue_slack * limit))
        return int(min(2 * limit, full + max(slack, math.ceil(limit - min(dry)))))

    # --- without queue gauges, with a canary: every canary ------------------------------------------

    def _paced(self, now: float, c: Canary, busy: bool) -> Decision:
        """Steer on the canary: it *waited* for its first token (the engine queues: it runs fewer
        than it is sent) or its tokens came at a pace that, for every request the client holds, makes
        the engine's tok/s. A level shows in one canary (seconds), not one answer latency (7-20 s on
        the H200, where judging 1024 by its answers held it 14 s at twice the latency)."""
        s = self.settings
        self._rates_at.append((now, self._paced_answers))
        del self._rates_at[:-5]
        self._age_ceiling()
        if c.sent_at <= self._changed_at:  # sent before the last change: it speaks of the old level
            return self._hold("measuring", "start" if not self._settled else "settled")
        step_s = c.itl or self._step_s
        # No queue: its first token within a few steps (its prefill, the step it joined), and half a
        # second at least: a loaded client reads late (seen at load 8: a canary of a 20 ms-step
        # engine "waited" 0.1-0.3 s with nothing queued). A short queue is counted in its tok/s below.
        queue_after = max(0.5, 5 * step_s) if step_s else 2.0
        waited = c.ttft if c.ttft is not None else c.age
        long_wait = waited > 2 * queue_after  # well behind a queue: no doubt, even while it runs
        if (waited > queue_after and c.ttft is not None) or (long_wait and not c.done):
            if self._acted_on == c.sent_at:
                return self.last  # this canary was acted on already: what was decided then stands
            self._acted_on = c.sent_at
            self._waits += 1
            # One such wait may be the client's own lag. At a level that already ran without a
            # queue it is most often a burst of admissions: a wave of equal answers ends together
            # and the requests that refill it reach the engine's front end at once, ahead of the
            # canary (seen on the H200: 512 -> 495 four times in a 4096-request run, each costing
            # a wave). There only three waits in a row are a queue; above it one long wait is.
            known = self._accepted is not None and self.target <= self._accepted
            if self._waits < (3 if known else 1 if long_wait else 2):
                return self._hold("measuring", self.last.phase)
            if not self.canary_place():
                # It had no place of its own: the engine's real cap may be below the limit harvest
                # knows (an upper bound KV memory lowers), and the canary on top of a full batch
                # waits for a place the level never asked for. Give it one and look again.
                self._reserve, self._waits = True, 0
                return self._hold("measuring", self.last.phase)
            self._ceiling, self._ceiling_left = self.target, s.ceiling_steps
            self._settled = True
            if self._accepted is not None and self._accepted < self.target:
                return self._move(now, self._accepted, "backoff", "queue")
            rate = self._answer_rate()
            if c.ttft is not None and rate:
                runs = max(1.0, c.outstanding - c.ttft * rate)  # it waited behind ttft x rate requests
                return self._move(now, runs + max(2.0, math.ceil(s.queue_slack * runs)), "backoff", "queue")
            return self._move(now, self.target * s.decrease, "backoff", "queue")
        if not c.done:
            return self._hold("measuring", self.last.phase)
        if c.itl is None or c.itl <= 0:
            return self._hold("hold", self.last.phase)
        if self._acted_on != c.sent_at:
            self._waits = 0  # it did not wait: a wait before was lag, or the level changed
        self._step_s = c.itl
        # Every request held runs at the canary's pace, but those it found queued ahead of it: its
        # wait past one step, times the answer rate. A short queue (16 behind a 64-request batch
        # that clears in 0.1 s) is as easy to miss in the wait as it is to count here.
        rate = self._answer_rate() or 0.0
        queued = max(0.0, (c.ttft or 0.0) - c.itl) * rate
        tok_s = max(1.0, c.outstanding - queued) / c.itl
        if self._accepted is not None and self.target > self._accepted:
            # A step up is kept on two canaries' mean: one canary's pace is within 5 % of the
            # next one's on the H200, and a probe x1.25 kept on one (640, 7 waves of 4096 equal
            # answers where 512 makes 8) cost x0.86 of the best fixed value. One that shows no
            # gain sends it back at once: leaving costs nothing, staying costs latency.
            base, base_tok_s = self._accepted, self._level_tok_s or 0.0
            self._judged.append(tok_s)
            if len(self._judged) < 2 and tok_s >= base_tok_s * (1 + s.gain):
                return self._hold("measuring", self.last.phase, tok_s)
            tok_s = statistics.fmean(self._judged)
            if tok_s < base_tok_s * (1 + s.gain):
                # A look up that did not pay: the next waits longer, each time twice as long (up to
                # ``8 x ceiling_steps``): a level that stays right costs fewer canaries and waves.
                wait = self._probe_wait if self._settled else s.ceiling_steps
                if self._settled:
                    self._probe_wait = min(2 * self._probe_wait, 8 * s.ceiling_steps)
                self._ceiling, self._ceiling_left = self.target, wait
                self._settled = True
                return self._move(now, base, "settled", "no gain", tok_s)
            self._probe_wait = s.ceiling_steps  # it paid: looks come at the usual pace again
        # The level's tok/s is the median of its last canaries: one that ran while a wave ended
        # and its refill was still in prefill paces a short batch (on the sim of the H200, 4416
        # tok/s among readings of 3470 at 512), and an average it pulls up makes the next step
        # up read no gain.
        if self._accepted == self.target and self._level_tok_s is not None:
            self._level_readings = (self._level_readings + [tok_s])[-5:]
        else:
            self._accepted, self._level_readings = self.target, [tok_s]
        self._level_tok_s = statistics.median(self._level_readings)
        factor = s.probe if self._settled else s.increase
        up = self.target * factor
        if self._ceiling is not None:
            # Settled under a ceiling: no look up until it lifts (``ceiling_steps``); starting (a
            # restart under an old ceiling): up to just below it.
            up = self.target if self._settled else min(up, self._ceiling - 1)
        if self._settled and len(self._level_readings) < _PROBE_BASE:
            # A look up is judged against the median of these: a few more first.
            return self._hold("measuring", "settled", tok_s)
        if not busy or up < self.target + 1 or self.target >= s.max_concurrency:
            return self._hold("hold", "settled" if self._settled else "start", tok_s)
        if self._settled:  # a look up once a ceiling lifted: shown with the level's tok/s it must beat
            return self._move(now, up, "probe", "look up", self._level_tok_s)
        return self._move(now, up, "start", "tok/s grew", tok_s)

    def _held_start(self) -> None:
        """A start at half a batch limit harvest knows (:func:`start_for`) is a level, not a guess:
        it is kept for ``ceiling_steps`` before the first look up, a probe, with the canary at rest.
        On the H200 (BENCHMARKS P7 A1) transformers' 1024 made x0.91-1.22 the tok/s of 512 across
        machines (about x1.03 typical), and with answers of equal length the canaries of one level
        read 1700-5300 tok/s by where in a wave they ran: a look up judged on two of them in the
        first seconds was a coin toss, and each that went wrong cost a wave (1024 at 4.6 s held the
        first answers to 17.5 s; kept where it did not pay, p50 x1.9)."""
        s = self.settings
        if self._accepted is None and not self._settled and s.batch_hint is not None \
                and self.target < s.batch_hint:
            self._settled = self._holding = True
            self._ceiling, self._ceiling_left = self.target + 1, s.ceiling_steps

    def canary_rests(self) -> bool:
        """Whether the canary rests: settled on a level it has read (or the held start), with no
        wait or step up to judge, there is nothing for it to decide until the ceiling lifts, and
        after that while it ran more than ``canary_share`` of the endpoint's time so far. It is not
        free: on the H200 transformers serve made x0.63-0.65 the tok/s of fixed 512 with one canary
        streamed back to back beside the 512 (BENCHMARKS.md, P7), and a look up it reads for looks
        for 5 %: its readings must cost less than that (a 2048-request run there lost 12 % to them)."""
        if not self._settled or self._waits or self._judged:
            return False
        if not (self.target == self._accepted or (self._holding and self._accepted is None)):
            return False
        # The next canary must fit the share too: a run too short to afford a look makes none.
        spent = self._canary_s + (self._canary_len or _CANARY_GUESS_STEPS * self.settings.interval_s)
        return self._ceiling_left > 0 or spent > self.settings.canary_share * self._endpoint_s()

    def _count_canary(self, now: float, canary: Canary | None) -> None:
        """The endpoint's time so far and the canary's share of it (each finished canary once)."""
        if self._first_at is None:
            self._first_at = now
        self._last_at = now
        if canary is not None and canary.done and canary.sent_at != self._counted_at:
            self._counted_at = canary.sent_at
            self._canary_s += max(0.0, canary.age)
            self._canary_len = max(0.0, canary.age)

    def _endpoint_s(self) -> float:
        return 0.0 if self._first_at is None else self._last_at - self._first_at

    def scrape_rests(self) -> bool:
        """With gauges: whether the last scrape left nothing to move soon, so the steering may scrape
        less often: settled, no step up under judgement, and no growth left but its queue (no exact
        cap known, the deepening done, or a ceiling over it). At an exact cap before the deepening,
        a dry scrape must be seen at once (A2: each second there cost a quarter of the tok/s)."""
        last, limit = self.last, self.settings.engine_limit
        if not last.gauges or last.phase != "settled" or self._trial is not None or self._queued:
            return False
        return limit is None or self.target >= 2 * limit or self._ceiling is not None

    def canary_place(self) -> bool:
        """Whether a canary takes one of the target's places: at or above the engine's batch limit
        (or with none known), where a canary sent on top would wait for a place the level never
        asked for. Below it the items keep the whole target: one place less would add a wave to
        a run of equal answers (4096 at 511 in flight is 9 waves, at 512 it is 8). A canary that
        waited there without a place once takes one from then on (the real cap was lower)."""
        hint = self.settings.batch_hint or self.settings.engine_limit
        return hint is None or self.target >= hint or self._reserve

    def _age_ceiling(self) -> None:
        """One step of a ceiling's life (``ceiling_steps``): then it lifts."""
        if self._ceiling_left > 0:
            self._ceiling_left -= 1
            if self._ceiling_left == 0:
                self._ceiling = None

    def _move(self, now: float, target: float, phase: str, reason: str, tok_s: float | None = None) -> Decision:
        before, self.target = self.target, self._bound(target)
        if self.target != before:
            self._changed_at, self._waits, self._judged = now, 0, []
        self.last = Decision(self.target, phase, reason, tok_s, False)
        return self.last

    def _hold(self, reason: str, phase: str, tok_s: float | None = None) -> Decision:
        self.last = Decision(self.target, phase, reason, tok_s if tok_s is not None else self.last.tok_s, False)
        return self.last

    def _answer_rate(self) -> float | None:
        """Answers per second over the last steps (the canary's own clock: the steps' times)."""
        if len(self._rates_at) < 2:
            return None
        (t0, n0), (t1, n1) = self._rates_at[0], self._rates_at[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else None

    # --- the steps ------------------------------------------------------------------------------

    def _measure(self, now: float, gauges: Gauges | None) -> _Observation | None:
        """This step's tok/s and latency per token; None while the step is not over (or no data)."""
        s = self.settings
        seen, self._seen = self._seen, gauges if gauges is not None else self._seen
        if gauges is not None and seen is not None and (
                _went_back(seen.generated, gauges.generated) or _went_back(seen.preemptions, gauges.preemptions)):
            return _Observation(None, None, gauges, False, True)  # seen at any step, not only a window's end
        if self._since is None:
            self._mark(now, gauges)
            return None
        elapsed = now - self._since
        if elapsed < s.interval_s * 0.9:
            return None
        has_tokens = gauges is not None and gauges.generated is not None
        # Measured by answers alone, a level shows only once its own requests come back: wait one
        # answer's latency (the last window's median; seconds on a GPU at a big batch) after a change,
        # and make each window that long, or the old level's answers and the newcomers' first slow
        # ones are what gets judged (seen on the H200: 512 judged no better than 256 in its first second).
        answer_s = 0.0 if has_tokens else min(self._answer_s, s.interval_s * s.max_wait_steps)
        if self._warming:  # after a change: the new requests are still in prefill
            if elapsed < max(s.interval_s * 0.9, answer_s):
                return None
            self._warming = False
            self._mark(now, gauges)
            return None
        if not has_tokens and elapsed < s.interval_s * s.max_wait_steps and (
                self._answers < max(4, self.target // 2) or elapsed < answer_s):
            return None  # measured by answers alone: wait for enough of them
        previous, self._last_gauges = self._last_gauges, gauges
        restarted = preempted = False
        tok_s = None
        if gauges is not None and previous is not None:
            restarted = _went_back(previous.generated, gauges.generated) or \
                _went_back(previous.preemptions, gauges.preemptions)
            if gauges.generated is not None and previous.generated is not None and not restarted:
                tok_s = (gauges.generated - previous.generated) / elapsed
            if gauges.preemptions is not None and previous.preemptions is not None:
                preempted = gauges.preemptions > previous.preemptions
        if tok_s is None and self._answers:
            tok_s = self._tokens / elapsed
        # The median, not the mean: at low batch one answer in ten can take 3 x the median (measured
        # on transformers serve), and one such tail must not read as "latency rose".
        tpot = statistics.median(self._tpots_now) if len(self._tpots_now) >= 3 else None
        if self._latencies_now:
            self._answer_s = statistics.median(self._latencies_now)
        self._mark(now, gauges)
        if tok_s is None and gauges is None:
            return None  # nothing came back yet: no verdict on this level
        return _Observation(tok_s, tpot, gauges, preempted, restarted)

    def _pressure(self, obs: _Observation) -> str | None:
        """The reason the engine is past what it can take, or None."""
        s = self.settings
        g = obs.gauges
        if obs.preempted:
            return "preemption"
        if g is not None and g.kv_usage is not None and g.kv_usage >= s.kv_high:
            return "kv full"
        if g is not None and g.waiting is not None and g.running is not None:
            if g.waiting > max(2.0, s.queue_slack * g.running):
                return "queue"
        if obs.tpot is not None and self._ref_tpot is not None:
            grew = obs.tok_s is not None and self._level_tok_s is not None and \
                obs.tok_s >= self._level_tok_s * (1 + s.gain)
            # Only above the last level that paid: at that level itself a slower answer with the same
            # requests in flight is the engine's work getting heavier (longer contexts), and sending
            # less would cut tok/s as much as latency (Little's law); seen on the H200, where a
            # back-off from the accepted 512 to 358 held the run at x0.82 of fixed 512.
            above = self._accepted is not None and self.target > self._accepted
            rose = obs.tpot > s.latency_rise * self._ref_tpot and not grew and above
            self._latency_strikes = self._latency_strikes + 1 if rose else 0
            # Only where no queue gauge speaks (an engine without /metrics), and only when it lasts two
            # steps: one step's rise is noise (a heavy latency tail, newcomers in prefill), and a
            # back-off while starting would pin the target low for the whole run (seen on the H200).
            # With gauges, the queue, KV use and preemptions say it directly.
            queue_known = g is not None and g.waiting is not None
            if rose and not queue_known and self._latency_strikes >= 2:
                self._latency_strikes = 0
                return "latency"
        return None

    def _decide(self, obs: _Observation, pressure: str | None) -> tuple[float, str, str]:
        """The next target from this step's observation (see the module docstring)."""
        s = self.settings
        tok_s = obs.tok_s
        if pressure is not None:
            self._ceiling = self.target
            self._settled, self._since_probe = True, 0
            g = obs.gauges
            target = self.target * s.decrease
            if pressure == "queue" and g is not None and g.running:
                target = min(target, g.running + max(1.0, math.ceil(s.queue_slack * g.running)))
            elif pressure == "latency" and self._accepted is not None and self._accepted < self.target:
                target = self._accepted  # latency rose without tok/s: back to the last level that paid
            self._level_tok_s = self._ref_tpot = None
            return target, "backoff", pressure
        if tok_s is None:
            return self.target, self.last.phase, "hold"
        self._levels[self.target] = tok_s
        if obs.tpot is not None:
            self._tpots[self.target] = obs.tpot
        if not self._settled:
            return self._grow(tok_s)
        return self._steady(tok_s)

    def _grow(self, tok_s: float) -> tuple[float, str, str]:
        """Starting: double while tok/s grows (one step without growth is given the benefit of the
        doubt); at a second such step in a row, settle on the best level."""
        s = self.settings
        previous = self._level_tok_s
        grew = previous is None or tok_s >= previous * (1 + s.gain)
        # One step without growth (flat, or even lower: one step of a loaded machine can read 20 %
        # low) is given the benefit of the doubt; the second in a row settles.
        flat = not grew and self._flat < 1
        if grew or flat:
            self._flat = 0 if grew else self._flat + 1
            self._level_tok_s = tok_s if previous is None else max(tok_s, previous)
            self._ref_tpot = self._tpots.get(self.target, self._ref_tpot)
            self._accepted = self.target
            if self.target >= s.max_concurrency:
                # At the top: the smallest level that gave (nearly) as much, not the top itself.
                self._settled = True
                best = self._best_level()
                self._level_tok_s = self._levels[best]
                self._ref_tpot = self._tpots.get(best, self._ref_tpot)
                self._accepted = best
                return best, "settled", "at max_concurrency"
            return self.target * s.increase, "start", "tok/s grew" if grew else "tok/s held"
        self._settled = True
        best = self._best_level()
        self._level_tok_s = self._levels[best]
        self._ref_tpot = self._tpots.get(best, self._ref_tpot)
        self._accepted = best
        return best, "settled", "no gain"

    def _steady(self, tok_s: float) -> tuple[float, str, str]:
        """Settled: hold; every ``probe_every`` steps try one step up and keep it if tok/s grew."""
        s = self.settings
        if self._probing is not None:
            base, base_tok_s = self._probing
            self._probing = None
            if tok_s >= base_tok_s * (1 + s.gain):
                self._level_tok_s = tok_s
                self._ref_tpot = self._tpots.get(self.target, self._ref_tpot)
                self._accepted = self.target
                if self._ceiling is None and self.target < s.max_concurrency:
                    # More paid and nothing pushed back: the settle was early (noise, or the engine
                    # got faster), so grow again by doubling instead of x``probe`` every ``probe_every``.
                    self._settled, self._flat = False, 0
                    return self.target * s.increase, "start", "probe gained: growing again"
                return self.target, "settled", "probe gained"
            self._level_tok_s = base_tok_s
            return base, "settled", "probe gave nothing"
        self._level_tok_s = tok_s if self._level_tok_s is None else 0.5 * (self._level_tok_s + tok_s)
        tpot = self._tpots.get(self.target)
        if tpot is not None:
            self._ref_tpot = tpot if self._ref_tpot is None else 0.5 * (self._ref_tpot + tpot)
        self._since_probe += 1
        ceiling = self._ceiling
        if self._since_probe >= s.probe_every and self.target < s.max_concurrency:
            self._since_probe = 0
            up = max(self.target + 1, self.target * s.probe)
            if ceiling is not None and up >= ceiling:
                self._ceiling = None  # the pressure that set it is old news: one look, then forget
                up = max(self.target + 1, min(up, ceiling))
            self._probing = (self.target, self._level_tok_s)
            return up, "probe", "probe"
        return self.target, "settled", "hold"

    def _bound(self, target: float) -> int:
        return int(min(max(round(target), 1), self.settings.max_concurrency))

    # --- helpers --------------------------------------------------------------------------------

    def _best_level(self) -> int:
        """The smallest level within ``settle_within`` of the best tok/s seen (less latency, same work)."""
        best = max(self._levels.values())
        return min(level for level, value in self._levels.items()
                   if value >= best * (1 - self.settings.settle_within))

    def _mark(self, now: float, gauges: Gauges | None) -> None:
        """Start a measuring window at ``now``."""
        self._since = now
        self._last_gauges = gauges
        self._tokens = self._answers = 0
        self._tpots_now: list[float] = []
        self._latencies_now: list[float] = []

    def _reset(self, target: int) -> None:
        self.target = max(1, target)
        self._since: float | None = None
        self._tokens = self._answers = 0
        self._tpots_now: list[float] = []
        self._latencies_now: list[float] = []
        self._level_tok_s: float | None = None
        #: With a canary: tok/s of the last canaries at the accepted level.
        self._level_readings: list[float] = []
        self._levels: dict[int, float] = {}
        self._tpots: dict[int, float] = {}
        self._settled = False
        self._since_probe = 0
        self._probing: tuple[int, float] | None = None
        self._ceiling: int | None = None
        self._warming = False
        self._flat = 0
        #: The last scrape seen at any step (a restart shows as a counter that went back).
        self._seen: Gauges | None = getattr(self, "_seen", None)
        self._latency_strikes = 0
        #: Median answer latency of the last measured window (how long a new level takes to show).
        self._answer_s = getattr(self, "_answer_s", 0.0)
        #: The last level whose tok/s paid for its latency (where a latency back-off returns to).
        self._accepted: int | None = None
        #: Latency per output token of the accepted level (what a rise is measured against).
        self._ref_tpot: float | None = None
        #: With gauges: the last scrape and its time, running counts of the last scrapes, scrapes in a
        #: row with a queue past the slack, and scrapes left under a preemption's ceiling.
        self._fill_prev: tuple[float, Gauges] | None = None
        self._peaks: list[float] = []
        self._queued = self._empty = 0
        self._ceiling_left = 0
        #: With a token counter: tok/s of the last scrapes at this target (the first scrape after a
        #: change skipped), and the step up being judged: (the level below, its tok/s).
        self._rates: list[float] = []
        self._settling = 0
        self._trial: tuple[int, float] | None = None
        #: With an exact engine limit: requests allowed for in transit (held by the client, not yet
        #: seen by the engine's scheduler), the running count of recent dry scrapes (None: not dry),
        #: and the allowance before a deepening under trial.
        self._transit = 0
        self._dry: list[float | None] = []
        self._trial_transit: int | None = None
        #: With a canary: when the target last changed (a canary sent before speaks of the old
        #: level), the engine's decode step as the last canary saw it, the canary a back-off already
        #: answered, and (step time, answers so far) of the last steps, for the answer rate.
        self._changed_at = float("-inf")
        self._step_s: float | None = None
        self._acted_on: float | None = None
        self._waits = 0
        #: With a canary: tok/s readings of a step up under judgement, whether the start is held at
        #: a known batch limit's half, and the ceiling after the next look up that does not pay.
        self._judged: list[float] = []
        self._holding = False
        self._probe_wait = self.settings.ceiling_steps
        #: A canary that waited without a place of its own: from then on it takes one.
        self._reserve: bool = getattr(self, "_reserve", False)
        self._rates_at: list[tuple[float, int]] = []
        self._paced_answers = getattr(self, "_paced_answers", 0)
        #: With a canary: the endpoint's first and last step, the seconds canaries ran (each counted
        #: once, by when it was sent), kept across restarts: what the canary cost so far.
        self._first_at: float | None = getattr(self, "_first_at", None)
        self._last_at: float = getattr(self, "_last_at", 0.0)
        self._canary_s: float = getattr(self, "_canary_s", 0.0)
        self._counted_at: float | None = getattr(self, "_counted_at", None)
        self._canary_len: float | None = getattr(self, "_canary_len", None)


def start_for(limit: int | None, *, metrics: bool, max_concurrency: int, fallback: int = 64,
              exact: bool = False) -> int:
    """The first target of an endpoint: the engine's batch limit when harvest knows it (it launched
    the engine), else ``fallback``; within [1, ``max_concurrency``].

    A limit known ``exact`` on an engine with /metrics starts where the controller would settle at
    once: the batch plus a short queue (``AutoSettings.queue_slack``), so the batch is full from the
    first answer on (vLLM CPU's 128: 144, one step sooner; a run of 20 s noticed the step).

    An engine without /metrics starts at half its limit: sent its full batch, only latency (an
    answer later) would say whether that overshot what it really runs at once (the requests per
    batch are an upper bound; KV memory or the step's token budget may hold fewer), and then half
    the requests of a short run wait twice as long. Half is held a while, then probed above
    (``AutoConcurrency._paced``).
    """
    start = fallback if limit is None else (limit if metrics else max(1, limit // 2))
    if limit is not None and metrics and exact:
        start = limit + max(2, math.ceil(AutoSettings.queue_slack * limit))
    return max(1, min(start, max_concurrency))


#: Scrapes of tok/s that judge a step up: their mean against the mean of as many last scrapes of
#: the level below, both tokens over time. Equal-length answers end in waves about
#: a second apart on vLLM CPU, so one-second scrapes alias them: two scrapes each (their median)
#: read a deepening worth x1.47 as "no gain" twice in a row (BENCHMARKS P7 A2, vLLM CPU).
_TRIAL_SCRAPES = 3
#: With an exact cap and a token counter: scrapes of tok/s at the cap a deepening is judged against.
_DEEPEN_BASE = 1
#: With a canary: readings of a settled level (their median) before a look up above it, taken
#: afresh after the canary rested (with answers of equal length one canary reads its level +-40 %).
_PROBE_BASE = 3

#: A canary's length before one finished, in control steps: 10 tokens at the H200's decode step at
#: 512 (~0.15 s) and its first token, about two seconds.
_CANARY_GUESS_STEPS = 2.0

#: Answers whose latency per token a step keeps (the median of the first ones is as good as all).
_TPOT_SAMPLE = 4096


def _went_back(before: float | None, after: float | None) -> bool:
    return before is not None and after is not None and after < before


__all__ = ["GAUGE_NAMES", "AutoConcurrency", "AutoSettings", "Decision", "Gauges", "start_for"]
