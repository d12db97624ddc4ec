"""What the client knows of the engine behind an endpoint, and the auto-concurrency knobs that gives.

For ``concurrency = "auto"`` an endpoint's controller starts and stops by what is known of its
engine: its batch limit, whether that is its hard cap, whether it has /metrics
(:class:`EngineLimit`). The client speaks HTTP only and never reads a server's settings: whoever
launched the engine says what it knows as these plain values (``harvest run``:
:func:`harvest.placement.engine_limit`, one per server of a fleet). :func:`auto_settings` turns them and ``[client]`` into
the controller's :class:`~harvest.client.autoconc.AutoSettings`. Values only, no I/O.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from harvest.client.autoconc import AutoSettings, start_for
from harvest.config import ClientConfig


@dataclass(frozen=True)
class EngineLimit:
    """What harvest knows of the engine behind an endpoint, for ``concurrency = "auto"``: its batch
    limit (None: unknown), whether that is its hard cap, whether it has /metrics, and whether the
    batch may serve the canary as a hint (not for an endpoint that may be any engine)."""

    batch: int | None
    exact: bool = False
    metrics: bool = True
    hint: bool = True


def auto_settings(limit: EngineLimit, config: ClientConfig, base: AutoSettings | None = None) -> AutoSettings:
    """The controller's knobs for an endpoint whose engine harvest knows as ``limit``: ``base``'s
    (or ``config``'s) with the start, the hard cap and the canary's hint of that engine."""
    top = base.max_concurrency if base is not None else config.max_concurrency
    start = config.auto_start or start_for(limit.batch, metrics=limit.metrics, max_concurrency=top,
                                           exact=limit.exact)
    engine_limit = limit.batch if limit.exact else None
    batch_hint = limit.batch if limit.hint else None
    if base is not None:
        return dataclasses.replace(base, start=min(start, top), engine_limit=engine_limit,
                                   batch_hint=batch_hint)
    return AutoSettings(start=min(start, top), max_concurrency=top, engine_limit=engine_limit,
                        batch_hint=batch_hint)


__all__ = ["EngineLimit", "auto_settings"]
