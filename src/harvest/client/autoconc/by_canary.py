"""Steering ``concurrency = "auto"`` on a canary, for an endpoint without /metrics that streams.

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
the next (up to 8 x). A start at the batch limit harvest knows (the default, :func:`start_for`) has
nothing above it: it settles on its first reading, and comes down only where the canary waits. A
start below that limit (``auto_start``) is a level from the start:
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

One step per control interval with the canary as it stands (:meth:`CanarySteps._paced`): it waited
(:meth:`CanarySteps._waited`: a queue), a step up is under judgement
(:meth:`CanarySteps._judge_look_up`), or it read the level (:meth:`CanarySteps._read_level`).
"""

from __future__ import annotations

import math
import statistics

from harvest.client.autoconc.readings import Canary
from harvest.client.autoconc.settings import Decision
from harvest.client.autoconc.state import ControllerState

#: With a canary: readings of a settled level (their median) before a look up above it, taken
#: afresh after the canary rested (with answers of equal length one canary reads its level +-40 %).
_PROBE_BASE = 3

#: A canary's length before one finished, in control steps: 10 tokens at the H200's decode step at
#: 512 (~0.15 s) and its first token, about two seconds.
_CANARY_GUESS_STEPS = 2.0


class CanarySteps(ControllerState):
    """Steering on a canary, one control step at a time (see the module docstring)."""

    #: tok/s of the last canaries at the accepted level.
    _level_readings: list[float]
    #: When the target last changed (a canary sent before speaks of the old level), the engine's
    #: decode step as the last canary saw it, the canary a back-off already answered, and the
    #: waits in a row.
    _changed_at: float
    _step_s: float | None
    _acted_on: float | None
    _waits: int
    #: tok/s readings of a step up under judgement, whether the start is held at a known batch
    #: limit's half, and the ceiling after the next look up that does not pay.
    _judged: list[float]
    _holding: bool
    _probe_wait: int
    #: (step time, answers so far) of the last steps, for the answer rate.
    _rates_at: list[tuple[float, int]]
    #: A step up just kept, in words ("512 paid x1.90 over 256"), for :attr:`why`.
    _paid: str | None
    #: (step time, answers so far) of the last three steps, and until when the level is vouched
    #: for by a whole wave of its answers (the canary rests until then at the top).
    _answers_at: list[tuple[float, int]]
    _vouched_until: float
    #: The latency of the last answer (kept across restarts).
    _last_latency: float
    # Kept across restarts:
    #: A canary that waited without a place of its own: from then on it takes one.
    _reserve: bool
    #: Answers so far (:meth:`~harvest.client.autoconc.controller.AutoConcurrency.record`).
    _paced_answers: int
    #: The endpoint's first and last step, the seconds canaries ran (each counted once, by when it
    #: was sent), and the last one's length: what the canary cost so far.
    _first_at: float | None
    _last_at: float
    _canary_s: float
    _counted_at: float | None
    _canary_len: float | None

    def _reset_canary(self) -> None:
        self._level_readings = []
        self._changed_at = float("-inf")
        self._step_s = None
        self._acted_on = None
        self._waits = 0
        self._judged = []
        self._holding = False
        self._probe_wait = self.settings.ceiling_steps
        self._rates_at = []
        self._paid = None
        self._answers_at = []
        self._vouched_until = float("-inf")

    def _init_canary_kept(self) -> None:
        """What a restart of the engine does not reset: the canary's place and its cost so far."""
        self._reserve = False
        self._paced_answers = 0
        self._last_latency = 0.0
        self._first_at = None
        self._last_at = 0.0
        self._canary_s = 0.0
        self._counted_at = None
        self._canary_len = None

    def _canary_step(self, now: float, canary: Canary | None, busy: bool | None) -> Decision:
        """One control step of an endpoint steered by a canary, ``canary`` its latest (None: none
        yet, or it rests)."""
        self._held_start()
        self._count_canary(now, canary)
        self._note_wave(now)
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

    def _paced(self, now: float, c: Canary, busy: bool) -> Decision:
        """Steer on the canary: it *waited* for its first token (the engine queues: it runs fewer
        than it is sent) or its tokens came at a pace that, for every request the client holds, makes
        the engine's tok/s. A level shows in one canary (seconds), not one answer latency (7-20 s on
        the H200, where judging 1024 by its answers held it 14 s at twice the latency)."""
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
            return self._waited(now, c, long_wait)
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
            judged, tok_s = self._judge_look_up(now, self._accepted, tok_s)
            if judged is not None:
                return judged
        return self._read_level(now, tok_s, busy)

    def _waited(self, now: float, c: Canary, long_wait: bool) -> Decision:
        """The canary waited for its first token past a few decode steps: the engine may queue."""
        s = self.settings
        if self._acted_on == c.sent_at:
            return self.last  # this canary was acted on already: what was decided then stands
        self._acted_on = c.sent_at
        self._waits += 1
        # One such wait may be the client's own lag. At a level that already ran without a
        # queue it is most often a burst of admissions: a wave of equal answers ends together
        # and the requests that refill it reach the engine's front end at once, ahead of the
        # canary (seen on the H200: 512 -> 495 four times in a 4096-request run, each costing
        # a wave). There only three waits in a row are a queue; above it one long wait is. So too
        # at a start held high on an engine that published nothing of its size (``UNKNOWN_START``):
        # it is a level until the canary shows a queue that lasts, not one refill's burst.
        known = (self._accepted is not None and self.target <= self._accepted) or (
            self._holding and self._accepted is None and self.settings.batch_hint is None)
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
        waited = f"queue: a canary waited {c.ttft if c.ttft is not None else c.age:.1f} s for its first token " \
                 f"at {self.target}"
        if self._accepted is not None and self._accepted < self.target:
            return self._move(now, self._accepted, "backoff", "queue", why=f"{waited}: back to {self._accepted}")
        rate = self._answer_rate()
        if c.ttft is not None and rate:
            runs = max(1.0, c.outstanding - c.ttft * rate)  # it waited behind ttft x rate requests
            return self._move(now, runs + max(2.0, math.ceil(s.queue_slack * runs)), "backoff", "queue",
                              why=f"{waited}: the engine runs about {runs:.0f}")
        return self._move(now, self.target * s.decrease, "backoff", "queue", why=f"{waited}: x{s.decrease:g}")

    def _judge_look_up(self, now: float, base: int, tok_s: float) -> tuple[Decision | None, float]:
        """A step up above ``base``, the accepted level: the decision when this canary settles it
        (measuring on, or back to ``base``), else None and the tok/s the step up is kept on."""
        # A step up is kept on two canaries' mean: one canary's pace is within 5 % of the
        # next one's on the H200, and a probe x1.25 kept on one (640, 7 waves of 4096 equal
        # answers where 512 makes 8) cost x0.86 of the best fixed value. One that shows no
        # gain sends it back at once: leaving costs nothing, staying costs latency.
        s = self.settings
        base_tok_s = self._level_tok_s or 0.0
        self._judged.append(tok_s)
        if len(self._judged) < 2 and tok_s >= base_tok_s * (1 + s.gain):
            return self._hold("measuring", self.last.phase, tok_s), tok_s
        tok_s = statistics.fmean(self._judged)
        ratio = f"x{tok_s / base_tok_s:.2f}" if base_tok_s > 0 else "more"
        if tok_s < base_tok_s * (1 + s.gain):
            # A look up that did not pay: the next waits longer, each time twice as long (up to
            # ``8 x ceiling_steps``): a level that stays right costs fewer canaries and waves.
            wait = self._probe_wait if self._settled else s.ceiling_steps
            if self._settled:
                self._probe_wait = min(2 * self._probe_wait, 8 * s.ceiling_steps)
            self._ceiling, self._ceiling_left = self.target, wait
            self._settled = True
            return self._move(now, base, "settled", "no gain", tok_s,
                              why=f"no gain: {self.target} read {ratio} the tok/s of {base}"), tok_s
        self._probe_wait = s.ceiling_steps  # it paid: looks come at the usual pace again
        self._paid = f"{self.target} paid {ratio} over {base}"
        return None, tok_s

    def _read_level(self, now: float, tok_s: float, busy: bool) -> Decision:
        """A canary read the level at ``tok_s`` (no wait, no step up refused): keep the reading,
        then hold or look up."""
        s = self.settings
        # The level's tok/s is the median of its last canaries: one that ran while a wave ended
        # and its refill was still in prefill paces a short batch (on the sim of the H200, 4416
        # tok/s among readings of 3470 at 512), and an average it pulls up makes the next step
        # up read no gain.
        if self._accepted == self.target and self._level_tok_s is not None:
            self._level_readings = (self._level_readings + [tok_s])[-5:]
        else:
            self._accepted, self._level_readings = self.target, [tok_s]
        self._level_tok_s = statistics.median(self._level_readings)
        top = min(s.max_concurrency, s.batch_hint or s.max_concurrency)
        if not self._settled and self.target >= top:
            # At the engine's batch limit (or max_concurrency): nothing above can run at once, so the
            # level is settled on this reading and the canary rests within its share of the time.
            self._settled = True
            return self._hold("hold", "settled", tok_s)
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
        paid, self._paid = self._paid, None
        if self._settled:  # a look up once a ceiling lifted: shown with the level's tok/s it must beat
            return self._move(now, up, "probe", "look up", self._level_tok_s,
                              why=f"looking up: {self.target} read {self._level_tok_s or 0:.0f} tok/s")
        return self._move(now, up, "start", "tok/s grew", tok_s,
                          why=f"probing: {paid}" if paid else f"probing: {self.target} read {tok_s:.0f} tok/s")

    def _held_start(self) -> None:
        """A start below a batch limit harvest knows (``auto_start``) is a level, not a guess:
        it is kept for ``ceiling_steps`` before the first look up, a probe, with the canary at rest.
        On the H200 (BENCHMARKS P7 A1) transformers' 1024 made x0.91-1.22 the tok/s of 512 across
        machines (about x1.03 typical), and with answers of equal length the canaries of one level
        read 1700-5300 tok/s by where in a wave they ran: a look up judged on two of them in the
        first seconds was a coin toss, and each that went wrong cost a wave (1024 at 4.6 s held the
        first answers to 17.5 s; kept where it did not pay, p50 x1.9)."""
        s = self.settings
        if self._accepted is not None or self._settled:
            return
        if s.batch_hint is not None and self.target < s.batch_hint:
            self._settled = self._holding = True
            self._ceiling, self._ceiling_left = self.target + 1, s.ceiling_steps
        elif self.target >= min(s.max_concurrency, s.batch_hint or s.max_concurrency):
            # At the batch limit (the default start, :func:`start_for`): nothing above to look for, so
            # the canary reads it only within its share of the time. What it looks for there is a
            # queue (the engine runs fewer at once); a short run that never reads one loses latency to
            # it, not tok/s, where a canary read at once costs the whole batch a third of its pace
            # (on the simulated H100, 2048 x 64: x0.945 of fixed 1024 with it).
            self._settled = self._holding = True

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
        s = self.settings
        if self.target >= min(s.max_concurrency, s.batch_hint or s.max_concurrency) and \
                self._last_at < self._vouched_until:
            return True  # at the top, a wave of the whole level just showed there is no queue
        # The next canary must fit the share too: a run too short to afford a look makes none.
        spent = self._canary_s + (self._canary_len or _CANARY_GUESS_STEPS * self.settings.interval_s)
        return self._ceiling_left > 0 or spent > self.settings.canary_share * self._endpoint_s()

    def _note_wave(self, now: float) -> None:
        """Answers of equal length that ran at once come back at once: (nearly) the whole level's
        answers within two steps say the engine ran all it was sent, no queue, which is all a canary
        at the top looks for. Reading it anyway costs a wave's last item a canary's length: the
        canary takes one of the places the refill wanted (simulated H100, 4096 x 64 streamed: the
        default made x0.974 of fixed 1024 with one canary at 40 s). Such a wave vouches for the level
        for ``ceiling_steps``; answers of mixed lengths never come in such waves."""
        self._answers_at.append((now, self._paced_answers))
        del self._answers_at[:-3]
        since, before = self._answers_at[0]
        # A wave, not a flow: a steady flow at the level brings back ``target x window / latency``
        # answers, under a quarter of the level in a window under a quarter of an answer's latency.
        if len(self._answers_at) == 3 and self._paced_answers - before >= 0.9 * self.target and \
                now - since <= 0.25 * self._last_latency:
            self._vouched_until = now + self.settings.ceiling_steps * self.settings.interval_s

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

    def canary_place(self) -> bool:
        """Whether a canary takes one of the target's places: at or above the engine's batch limit
        (or with none known), where a canary sent on top would wait for a place the level never
        asked for. Below it the items keep the whole target: one place less would add a wave to
        a run of equal answers (4096 at 511 in flight is 9 waves, at 512 it is 8). A canary that
        waited there without a place once takes one from then on (the real cap was lower)."""
        hint = self.settings.batch_hint or self.settings.engine_limit
        return hint is None or self.target >= hint or self._reserve

    def _move(self, now: float, target: float, phase: str, reason: str, tok_s: float | None = None, *,
              why: str = "") -> Decision:
        before, self.target = self.target, self._bound(target)
        if self.target != before:
            self._changed_at, self._waits, self._judged = now, 0, []
            self._answers_at, self._vouched_until = [], float("-inf")
            self.why = why or reason
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


__all__ = ["CanarySteps"]
