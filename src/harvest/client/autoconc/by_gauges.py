"""Steering ``concurrency = "auto"`` on the engine's gauges (vLLM, SGLang, llama.cpp /metrics).

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

One step per scrape (:meth:`GaugeSteps._fill`), in named parts: the scrape against the one before
(tok/s, preemptions, a restart), the windows it joins (what ran at most, the queue), the cap of an
exact engine limit, then the first rule that speaks (a step up under judgement, a preemption, a
queue, a full KV cache, a deepening at the cap, room above, hold).
"""

from __future__ import annotations

import math
import statistics

from harvest.client.autoconc.readings import Gauges, went_back
from harvest.client.autoconc.settings import Decision
from harvest.client.autoconc.state import ControllerState

#: Scrapes of tok/s that judge a step up: their mean against the mean of as many last scrapes of
#: the level below, both tokens over time. Equal-length answers end in waves about
#: a second apart on vLLM CPU, so one-second scrapes alias them: two scrapes each (their median)
#: read a deepening worth x1.47 as "no gain" twice in a row (BENCHMARKS P7 A2, vLLM CPU).
_TRIAL_SCRAPES = 3
#: With an exact cap and a token counter: scrapes of tok/s at the cap a deepening is judged against.
_DEEPEN_BASE = 1


class GaugeSteps(ControllerState):
    """Steering on the engine's gauges, one scrape at a time (see the module docstring)."""

    #: The last scrape and its time.
    _fill_prev: tuple[float, Gauges] | None
    #: Running counts of the last ``peak_window`` scrapes.
    _peaks: list[float]
    #: Scrapes in a row with a queue past the slack, and with an empty queue.
    _queued: int
    _empty: int
    #: With a token counter: tok/s of the last scrapes at this target (the first scrape after a
    #: change skipped: ``_settling``), and the step up being judged: (the level below, its tok/s).
    _rates: list[float]
    _settling: int
    _trial: tuple[int, float] | None
    #: With an exact engine limit: requests allowed for in transit (held by the client, not yet
    #: seen by the engine's scheduler), the running count of recent dry scrapes (None: not dry),
    #: and the allowance before a deepening under trial.
    _transit: int
    _dry: list[float | None]
    _trial_transit: int | None
    #: What the last judged step up came to, in words, for :attr:`why` (None: none this scrape).
    _verdict: str | None

    def _reset_gauges(self) -> None:
        self._fill_prev = None
        self._peaks = []
        self._queued = self._empty = 0
        self._rates = []
        self._settling = 0
        self._trial = None
        self._transit = 0
        self._dry = []
        self._trial_transit = None
        self._verdict = None

    def _fill(self, now: float, g: Gauges, busy: bool | None) -> Decision:
        """One scrape of an engine with queue gauges: keep its queue short but never empty."""
        prev, self._fill_prev = self._fill_prev, (now, g)
        self._seen = g
        tok_s, preempted, restarted = _since(prev, now, g)
        if restarted:
            self._reset(min(self.target, self.settings.start))
            self._fill_prev = (now, g)
            self.last = Decision(self.target, "restart", "engine counters reset", None, True)
            return self.last
        running, waiting = float(g.running or 0.0), float(g.waiting or 0.0)
        peak, slack = self._note(running, waiting, tok_s)
        full = self._full(running, waiting, busy)
        # Busy: the client kept the endpoint at its target (None: judged from the engine's counts).
        kept = busy if busy is not None else running + waiting >= 0.9 * self.target
        target, phase, reason = self._rule(g, preempted, kept, running, waiting, peak, slack, full)
        if full is not None and self.target >= full and reason in ("hold", "not filled"):
            phase, reason = "settled", "at the engine's batch limit"
        before, self.target = self.target, self._bound(target)
        if phase == "start" and target > self.target:  # it would take more than max_concurrency allows
            phase, reason = "settled", "at max_concurrency"
        if self.target != before:
            self._rates, self._settling = [], 1
        if self._trial is not None and self.target <= self._trial[0]:
            self._trial, self._trial_transit = None, None  # backed off or bounded: nothing left to judge
        self._say_gauges(before, reason, peak, slack)
        self.last = Decision(self.target, phase, reason, tok_s, True)
        return self.last

    def _say_gauges(self, before: int, reason: str, peak: float, slack: float) -> None:
        """The level's reason in words (:attr:`why`) after a scrape moved it, or settled it on a queue."""
        said, self._verdict = self._verdict, None
        if reason in ("no gain", "fewer tokens") and said:
            self.why = said
        elif reason == "queue":
            self.why = f"engine queue: it runs {peak:.0f} at most, +{slack:.0f} queued"
        elif self.target == before:
            if said:  # a step up that paid, held there
                self.why = said
        elif reason == "engine takes more":
            self.why = f"probing: {said}" if said else f"probing: the engine ran all {before} it was sent"
        elif reason == "preemption":
            self.why = f"preemption at {before}: backed off x{self.settings.decrease:g}"
        elif reason.startswith("engine's queue ran dry"):
            self.why = f"deepening: the engine's queue ran dry at its batch limit {self.settings.engine_limit}"
        elif reason == "at the engine's batch limit":
            self.why = f"at the engine's batch limit {self.settings.engine_limit}, +a short queue"
        elif reason == "at max_concurrency":
            self.why = f"at max_concurrency {self.settings.max_concurrency}"

    def _note(self, running: float, waiting: float, tok_s: float | None) -> tuple[float, float]:
        """Add one scrape to the windows; what the engine ran at most lately, and the queue
        tolerated over it."""
        s = self.settings
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
        return peak, slack

    def _full(self, running: float, waiting: float, busy: bool | None) -> int | None:
        """With an exact engine limit: where the target stops (its batch, a short queue, and what is
        on its way between the client and the engine's scheduler: ``_transit``); the scrape noted
        as dry or not. None without one."""
        s = self.settings
        if s.engine_limit is None:
            return None
        full = s.engine_limit + max(2, math.ceil(s.queue_slack * s.engine_limit)) + self._transit
        # Dry: the client holds its target, the engine's queue is empty and its batch not full.
        # What the client holds and the engine does not see is in transit (its HTTP server,
        # tokenizing, answers being sent back): measured on vLLM CPU, 144 in flight kept its
        # 128-request batch short and fixed 256 made x1.28 the tok/s of fixed 128.
        dry = self.target >= full and busy is not False and waiting == 0 and running < 0.9 * s.engine_limit
        self._dry.append(running if dry else None)
        del self._dry[:-s.peak_window]
        return full

    def _rule(self, g: Gauges, preempted: bool, kept: bool, running: float, waiting: float, peak: float,
              slack: float, full: int | None) -> tuple[float, str, str]:
        """The next target, phase and reason by the first rule that speaks for this scrape."""
        s = self.settings
        target: float = self.target
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
        elif kept and waiting < max(1.0, slack / 2) and (peak >= 0.8 * self.target or self._empty >= 3):
            # It ran 80 % of what it was sent in a recent scrape (or its queue read empty three
            # scrapes in a row: the rest are in transit, in its HTTP server or on their way back, as
            # on a CPU-starved vLLM at load 20), its queue is under half the slack (the queue kept at
            # the slack on purpose does not count), and we keep it busy: there may be room above.
            # One scrape's empty queue alone is no proof (seen on a 4-sequence vLLM: between two
            # answers its queue reads 0 while it runs its 4).
            target, phase, reason = self._up(g, full)
        elif self._queued or (waiting >= max(1.0, slack / 2) and kept):
            # Kept busy with a queue of its own (at the slack, on purpose), or queued past it once:
            # full, hold. Kept busy with no queue but running fewer: the rest is in transit.
            phase, reason = "settled", "hold"
        else:  # the client does not keep it at its target (too few items, fast answers): no verdict
            phase, reason = self.last.phase, "not filled"
        return target, phase, reason

    def _up(self, g: Gauges, full: int | None) -> tuple[float, str, str]:
        """The engine takes more: a step up, unless a cap, a ceiling or a step under judgement
        holds it; with a token counter the step up is judged on tok/s (:meth:`_judge_trial`)."""
        s = self.settings
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
        return target, phase, reason

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
        before_transit = self._trial_transit  # the allowance before a deepening; None: a step up
        deepening = before_transit is not None
        bar = base_tok_s * (1 - s.gain) if deepening else base_tok_s * (1 + s.gain)
        made = statistics.fmean(self._rates[-_TRIAL_SCRAPES:])
        ratio = made / base_tok_s if base_tok_s > 0 else float("inf")
        if made >= bar:
            self._trial_transit = None
            self._verdict = f"{self.target} paid x{ratio:.2f} over {base}"
            return None  # it paid: the usual rules (grow again, hold, queue) go on from here
        self._verdict = f"no gain: {self.target} made x{ratio:.2f} the tok/s of {base}"
        # No growth above ``base`` for a while; then one more look (the engine or the work changes).
        self._ceiling, self._ceiling_left = base + 1, s.ceiling_steps
        if before_transit is not None:  # a deeper queue that cost tokens: back to the old one
            self._transit, self._trial_transit = before_transit, None
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

    def scrape_rests(self) -> bool:
        """With gauges: whether the last scrape left nothing to move soon, so the steering may scrape
        less often: settled, no step up under judgement, and no growth left but its queue (no exact
        cap known, the deepening done, or a ceiling over it). At an exact cap before the deepening,
        a dry scrape must be seen at once (A2: each second there cost a quarter of the tok/s)."""
        last, limit = self.last, self.settings.engine_limit
        if not last.gauges or last.phase != "settled" or self._trial is not None or self._queued:
            return False
        return limit is None or self.target >= 2 * limit or self._ceiling is not None


def _since(prev: tuple[float, Gauges] | None, now: float, g: Gauges) -> tuple[float | None, bool, bool]:
    """The engine's tok/s since the previous scrape (None: no counter, or no scrape before), whether
    it preempted and whether it restarted (a counter went back) in between."""
    tok_s = None
    preempted = restarted = False
    if prev is not None:
        before_t, before = prev
        restarted = went_back(before.generated, g.generated) or went_back(before.preemptions, g.preemptions)
        if g.generated is not None and before.generated is not None and now > before_t and not restarted:
            tok_s = (g.generated - before.generated) / (now - before_t)
        preempted = not restarted and g.preemptions is not None and before.preemptions is not None \
            and g.preemptions > before.preemptions
    return tok_s, preempted, restarted


__all__ = ["GaugeSteps"]
