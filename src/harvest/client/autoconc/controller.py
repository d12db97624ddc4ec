"""The controller of one endpoint for ``concurrency = "auto"``: :class:`AutoConcurrency`.

A controller owns one number, the endpoint's *target* (requests in flight it may hold). It starts
from what harvest knows (:func:`~harvest.client.autoconc.settings.start_for`: the batch limit of an
engine it launched, vLLM ``max_num_seqs``, SGLang ``max_running_requests``, llama.cpp slots,
transformers' requests per batch) and moves by whichever signal the endpoint gives, chosen anew at
each step (:meth:`AutoConcurrency.step`):

    gauges    the engine's /metrics has running and waiting: every scrape (:mod:`.by_gauges`)
    canary    no such gauges, a canary streams: every control step (:mod:`.by_canary`)
    answers   neither: one measuring window of answers at a time (:mod:`.by_answers`)

A counter that went backwards (generation tokens, preemptions) means the engine restarted: the
controller forgets what it learnt and starts again from ``start``.

It never does I/O and never reads a clock: the client feeds it answers (:meth:`record`) and,
once per step, the gauges it scraped with the time (:meth:`step`). So a test drives it with a
trace, and the client decides where the numbers come from.
"""

from __future__ import annotations

from harvest.client.autoconc.by_answers import AnswerSteps
from harvest.client.autoconc.by_canary import CanarySteps
from harvest.client.autoconc.by_gauges import GaugeSteps
from harvest.client.autoconc.readings import Canary, Gauges
from harvest.client.autoconc.settings import AutoSettings, Decision

#: Answers whose latency per token a step keeps (the median of the first ones is as good as all).
_TPOT_SAMPLE = 4096


class AutoConcurrency(GaugeSteps, CanarySteps, AnswerSteps):
    """The controller of one endpoint: see the module docstring."""

    def __init__(self, settings: AutoSettings | None = None):
        self.settings = settings or AutoSettings()
        # Kept across restarts of the engine (:meth:`_reset` leaves them).
        self._seen = None
        self._answer_s = 0.0
        self._last_gauges = None
        self._init_canary_kept()
        self._reset(self.settings.start)
        self.last = Decision(self.target, "start", "initial")
        self.why = self.settings.origin or f"start {self.target}"

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
        self._last_latency = max(latency_s, 0.0)
        if tokens > 0 and latency_s > 0 and len(self._tpots_now) < _TPOT_SAMPLE:
            self._tpots_now.append(latency_s / tokens)
        if latency_s > 0 and len(self._latencies_now) < _TPOT_SAMPLE:
            self._latencies_now.append(latency_s)
        if tokens > 0 and latency_s > 0:
            self._work_tokens += tokens
            self._work_s += latency_s

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
            return self._canary_step(now, canary, busy)
        return self._answers_step(now, gauges, busy)

    def _reset(self, target: int) -> None:
        self.target = max(1, target)
        self.why = f"the engine restarted (its counters went back): from {self.target} again"
        self._settled = False
        self._ceiling = None
        self._ceiling_left = 0
        self._accepted = None
        self._level_tok_s = None
        self._reset_answers()
        self._reset_gauges()
        self._reset_canary()


__all__ = ["AutoConcurrency"]
