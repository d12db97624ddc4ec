"""What the client knows of the engine behind an endpoint, and the auto-concurrency knobs that gives.

For ``concurrency = "auto"`` an endpoint's controller starts and stops by what is known of its
engine: its batch limit, whether that is its hard cap, whether it has /metrics
(:class:`EngineLimit`). The client never reads a server's settings: whoever launched the engine
says what it knows as these plain values (``harvest run``: :func:`harvest.placement.engine_limit`,
one per server of a fleet); of an engine nobody told it about, it asks what the engine publishes
over HTTP before any item (:mod:`harvest.client.capacity`). :func:`auto_settings` turns them and
``[client]`` into the controller's :class:`~harvest.client.autoconc.AutoSettings`, with the words
that say why it starts where it does. Values only, no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
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
    #: Where ``batch`` comes from, in words ("engine capacity 4 from /props"); "" for a launch.
    source: str = ""


def auto_settings(limit: EngineLimit, config: ClientConfig, base: AutoSettings | None = None) -> AutoSettings:
    """The controller's knobs for an endpoint whose engine harvest knows as ``limit``: ``base``'s
    (or ``config``'s) with the start, the hard cap and the canary's hint of that engine."""
    top = base.max_concurrency if base is not None else config.max_concurrency
    start = min(config.auto_start or start_for(limit.batch, metrics=limit.metrics, max_concurrency=top,
                                               exact=limit.exact), top)
    engine_limit = limit.batch if limit.exact else None
    batch_hint = limit.batch if limit.hint else None
    origin = _origin(limit, start, config.auto_start)
    if base is not None:
        return dataclasses.replace(base, start=start, engine_limit=engine_limit, batch_hint=batch_hint, origin=origin)
    return AutoSettings(start=start, max_concurrency=top, engine_limit=engine_limit, batch_hint=batch_hint,
                        origin=origin)


def to_ask(urls: Sequence[str], own: Mapping[str, EngineLimit], default: EngineLimit,
           config: ClientConfig) -> list[str]:
    """The endpoints whose engine is asked what it publishes of its capacity before any item
    (:mod:`harvest.client.capacity`): those nobody gave a batch for, and ``[client] endpoints``
    (any engine: the ``[server]``'s batch is only a guess for them); none when ``[client]
    auto_start`` sets the start."""
    if config.auto_start:
        return []
    return [url for url in urls
            if (own[url].batch is None if url in own else default.batch is None or bool(config.endpoints))]


def _origin(limit: EngineLimit, start: int, auto_start: int | None) -> str:
    """Why an endpoint starts at ``start``, in words (the level's reason until it first moves)."""
    if auto_start:
        return f"[client] auto_start {auto_start}"
    where = limit.source or (f"batch limit {limit.batch} of the engine harvest launched" if limit.batch
                             else "engine capacity not known yet" if limit.metrics
                             else "no /metrics and nothing published of its capacity: starting high")
    if limit.batch is not None and start > limit.batch:
        where += f", +{start - limit.batch} queued"
    elif limit.batch is not None and start < limit.batch:
        where += f", bounded by max_concurrency {start}"
    return where


__all__ = ["EngineLimit", "auto_settings", "to_ask"]
