"""Steering ``concurrency = "auto"`` on answers alone: an endpoint without queue gauges or a canary.

**Answers alone** (no /metrics and no canary: it does not stream, or the target is under the canary's
minimum), once per control step, in four named steps:

    measure   generation tok/s over the step: the engine's token counter when /metrics has one;
              otherwise the *work done* while the client held the level, requests held x the
              answers' tokens over their latencies (Little's law: each answer is a reading, where
              the tokens of the answers that came back in one window count whole waves of equal
              answers, or none), or, held short of the level, the tokens that came back; latency per
              output token of those answers, and the engine's gauges: running, waiting, KV-cache
              use, preemptions. A window lasts one answer latency at least (a wave is not a trend)
    pressure  is the engine past what it can take?  preemptions appeared; KV use >= ``kv_high``;
              the queue is longer than ``queue_slack`` x running; or, for an engine without queue
              gauges only (no /metrics), the median latency per output token rose ``latency_rise`` x
              above the accepted level's without tok/s growing with it, two steps in a row (one
              is noise: a heavy latency tail, newcomers still in prefill), at a level that never made
              ``gain`` more than the accepted one (a level that paid is never a ceiling from latency)
    decide    under pressure: back off (to what the engine runs plus a little headroom when its
              queue is the reason, to the last level that paid when latency is, else
              x ``decrease``) and remember the level as a ceiling; otherwise, while starting:
              double while tok/s grows by ``gain`` (one step without growth is given the benefit
              of the doubt); then settle on the smallest level within ``settle_within`` of the best tok/s;
              when settled: every ``probe_every`` steps probe one step up, kept only if tok/s grew;
              a probe that paid with no pressure remembered goes back to doubling
    bound     clamp to [1, ``max_concurrency``]

The answers come in through :meth:`~harvest.client.autoconc.controller.AutoConcurrency.record`.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from harvest.client.autoconc.readings import Gauges, went_back
from harvest.client.autoconc.settings import Decision
from harvest.client.autoconc.state import ControllerState


@dataclass(frozen=True)
class _Observation:
    """What one measuring window saw (:meth:`AnswerSteps._measure`)."""

    tok_s: float | None
    tpot: float | None
    gauges: Gauges | None
    preempted: bool
    restarted: bool


class AnswerSteps(ControllerState):
    """Steering on answers, one measuring window at a time (see the module docstring)."""

    #: The measuring window: its start (None: not started), the tokens and answers that came back
    #: in it, and the latency per output token and the latency of its first answers.
    _since: float | None
    _tokens: int
    _answers: int
    _tpots_now: list[float]
    _latencies_now: list[float]
    #: tok/s and latency per output token measured at each level.
    _levels: dict[int, float]
    _tpots: dict[int, float]
    #: Steps since the last probe, and the probe being judged: (the level below, its tok/s).
    _since_probe: int
    _probing: tuple[int, float] | None
    #: The target just changed: the next window starts once the new requests are in.
    _warming: bool
    #: Steps in a row without growth while starting, and with latency risen.
    _flat: int
    _latency_strikes: int
    #: Latency per output token of the accepted level (what a rise is measured against).
    _ref_tpot: float | None
    #: The most tok/s any window measured at each level.
    _best_at: dict[int, float]
    #: The window's answers: their tokens and their latencies summed (the work done).
    _work_tokens: int
    _work_s: float
    #: The tok/s of the last judged level over the one below it (None: nothing below).
    _grew_by: float | None
    # Kept across restarts:
    #: Median answer latency of the last measured window (how long a new level takes to show).
    _answer_s: float
    #: The gauges at the start of the window.
    _last_gauges: Gauges | None

    def _reset_answers(self) -> None:
        self._since = None
        self._tokens = self._answers = 0
        self._tpots_now = []
        self._latencies_now = []
        self._levels = {}
        self._tpots = {}
        self._since_probe = 0
        self._probing = None
        self._warming = False
        self._flat = 0
        self._latency_strikes = 0
        self._ref_tpot = None
        self._best_at = {}
        self._grew_by = None
        self._work_tokens, self._work_s = 0, 0.0

    def _answers_step(self, now: float, gauges: Gauges | None, busy: bool | None = None) -> Decision:
        """One control step on answers (and the token counter and KV gauges of ``gauges``, when
        /metrics has them): measure, pressure, decide, bound. ``busy``: the client held the level
        (None: taken as held)."""
        obs = self._measure(now, gauges, busy is not False)
        if obs is None:
            return self.last
        if obs.restarted:
            self._reset(min(self.target, self.settings.start))
            self._mark(now, gauges)
            self.last = Decision(self.target, "restart", "engine counters reset", None, True)
            return self.last
        pressure = self._pressure(obs)
        rise = obs.tpot / self._ref_tpot if obs.tpot and self._ref_tpot else None
        target, phase, reason = self._decide(obs, pressure)
        before, self.target = self.target, self._bound(target)
        self._warming = self.target != before
        self._say_answers(before, phase, reason, rise)
        self.last = Decision(self.target, phase, reason, obs.tok_s, obs.gauges is not None)
        return self.last

    def _say_answers(self, before: int, phase: str, reason: str, rise: float | None) -> None:
        """The level's reason in words (:attr:`why`) after a step that moved or settled it
        (``rise``: latency per token over the accepted level's)."""
        if reason == "latency":
            self.why = f"ceiling: latency x{rise or self.settings.latency_rise:.1f} without gain at {before}"
        elif phase == "backoff":
            self.why = f"{reason} at {before}"
        elif reason in ("tok/s grew", "probe gained", "probe gained: growing again") and self._grew_by:
            self.why = f"probing: {before} paid x{self._grew_by:.2f}"
        elif reason in ("no gain", "at max_concurrency"):
            self.why = f"{reason}: settled on {self.target}, the smallest level within " \
                       f"{self.settings.settle_within:.0%} of the best tok/s"
        elif reason == "probe gave nothing":
            self.why = f"probe gave nothing: back to {self.target}"
        elif self.target != before:
            self.why = f"{reason}: {self.target}"

    def _measure(self, now: float, gauges: Gauges | None, busy: bool = True) -> _Observation | None:
        """This step's tok/s and latency per token; None while the step is not over (or no data)."""
        s = self.settings
        seen, self._seen = self._seen, gauges if gauges is not None else self._seen
        if gauges is not None and seen is not None and (
                went_back(seen.generated, gauges.generated) or went_back(seen.preemptions, gauges.preemptions)):
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
            restarted = went_back(previous.generated, gauges.generated) or \
                went_back(previous.preemptions, gauges.preemptions)
            if gauges.generated is not None and previous.generated is not None and not restarted:
                tok_s = (gauges.generated - previous.generated) / elapsed
            if gauges.preemptions is not None and previous.preemptions is not None:
                preempted = gauges.preemptions > previous.preemptions
        if tok_s is None and self._answers:
            # Work done at the level: its requests held x each answer's tokens over its latency.
            # Counted as the answers came back, a window of one answer latency holds one wave of
            # equal answers, two or none: on the H100's curve, windows at 1024 read 3277-6554 tok/s
            # where it made a steady 4900 (tests/client/test_autoconc.py, WaveEngine).
            worked = self.target * self._work_tokens / self._work_s if busy and self._work_s > 0 else None
            tok_s = worked if worked is not None else self._tokens / elapsed
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
            # A level that ever made ``gain`` more than the accepted one did pay for its latency
            # (tok/s x6 with latency +35 % from 64 to 512 on the H100): never a ceiling from latency.
            paid = self._level_tok_s is not None and \
                self._best_at.get(self.target, 0.0) >= self._level_tok_s * (1 + s.gain)
            rose = obs.tpot > s.latency_rise * self._ref_tpot and not grew and above and not paid
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
        self._best_at[self.target] = max(tok_s, self._best_at.get(self.target, 0.0))
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
        self._grew_by = tok_s / previous if previous else None
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
            self._grew_by = tok_s / base_tok_s if base_tok_s else None
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
        self._tpots_now = []
        self._latencies_now = []
        self._work_tokens, self._work_s = 0, 0.0


__all__ = ["AnswerSteps"]
