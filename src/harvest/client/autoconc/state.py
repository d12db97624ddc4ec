"""What every way of steering an endpoint shares: its target, the last decision, and what was
learnt of its levels (the last level that paid and its tok/s, whether it settled, a ceiling on growth).

Each way of steering is a class of steps over this state: on the engine's gauges
(:mod:`.by_gauges`), on a canary (:mod:`.by_canary`), on answers alone (:mod:`.by_answers`).
:class:`~harvest.client.autoconc.controller.AutoConcurrency` is all three and picks one at each step.
No I/O, no clock.
"""

from __future__ import annotations

from harvest.client.autoconc.readings import Gauges
from harvest.client.autoconc.settings import AutoSettings, Decision


class ControllerState:
    """The state every way of steering reads and moves (the ways keep their own beside it)."""

    settings: AutoSettings
    #: Requests in flight the endpoint may hold.
    target: int
    #: The last step's decision.
    last: Decision
    #: Why the target is where it is, in words (the panel and ``status --json``): where it started
    #: and why (``AutoSettings.origin``), or the last move and what was measured for it.
    why: str
    #: The last scrape seen at any step (a restart shows as a counter that went back).
    _seen: Gauges | None
    #: Out of the start: the level was judged (growth stopped, or a back-off).
    _settled: bool
    #: No growth to this level or above while it is set.
    _ceiling: int | None
    #: Steps (scrapes, canaries) left before the ceiling lifts by itself (0: it stays until a look
    #: up reaches it, on answers alone).
    _ceiling_left: int
    #: The last level whose tok/s paid for its latency (where a latency back-off returns to).
    _accepted: int | None
    #: tok/s of the accepted level.
    _level_tok_s: float | None

    def _reset(self, target: int) -> None:
        """Forget what was learnt (the engine restarted) and start again at ``target``."""
        raise NotImplementedError

    def _bound(self, target: float) -> int:
        return int(min(max(round(target), 1), self.settings.max_concurrency))

    def _age_ceiling(self) -> None:
        """One step of a ceiling's life (``ceiling_steps``): then it lifts."""
        if self._ceiling_left > 0:
            self._ceiling_left -= 1
            if self._ceiling_left == 0:
                self._ceiling = None


__all__ = ["ControllerState"]
