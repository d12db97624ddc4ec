"""``concurrency = "auto"``: one controller per endpoint that finds how many requests it can take.

The controller (:class:`AutoConcurrency`, ``controller.py``) owns the endpoint's target and steers it
on whichever signal the endpoint gives: the engine's gauges (``by_gauges.py``), a canary
(``by_canary.py``) or its answers alone (``by_answers.py``), over the state they share
(``state.py``). What it is fed (``readings.py``: :class:`Gauges`, :class:`Canary`) and its knobs
(``settings.py``: :class:`AutoSettings`, :class:`Decision`, :func:`start_for`) are plain values. It
never does I/O and never reads a clock: :mod:`harvest.client.steer` feeds it.
"""

from __future__ import annotations

from harvest.client.autoconc.controller import AutoConcurrency
from harvest.client.autoconc.readings import GAUGE_NAMES, Canary, Gauges
from harvest.client.autoconc.settings import AutoSettings, Decision, start_for

__all__ = ["GAUGE_NAMES", "AutoConcurrency", "AutoSettings", "Canary", "Decision", "Gauges", "start_for"]
