"""client: the async OpenAI-compatible client the runner drives prompts through.

One :class:`Client` per process: concurrency limit, per-request timeouts, retries with backoff,
sick-server pauses that do not charge items, least-outstanding balancing over several endpoints,
and :func:`scrape_metrics` for an engine's Prometheus ``/metrics``. See ``core`` for the rules.

    async with Client.from_config(cfg) as client:          # or Client([url, ...], cfg.client, cfg.sampling,
        try:                                                #      api_key=server.api_key(), model=...)
            done = await client.chat(messages, max_tokens=1024)
        except RequestError as exc:    # this item failed: 4xx, or retries spent; record exc.status, str(exc)
            ...
        except ServerSick:             # every endpoint stayed down past health_deadline: stop the run
            ...
        client.stats()                 # in flight, held, retries, errors by kind, per-endpoint outstanding

Requests held while a server is sick are not charged to their items: ``done.attempts`` counts only
the attempts the item paid for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harvest.lazy import lazy

if TYPE_CHECKING:
    from harvest.client.core import Client
    from harvest.client.engine import EngineLimit
    from harvest.client.metrics import (
        LOAD_METRICS,
        MetricsFormatError,
        Sample,
        parse_prometheus_text,
        scrape_metrics,
        sum_by_name,
    )
    from harvest.client.policy import RetryPolicy
    from harvest.client.records import ClientStats, Completion, EndpointState, EndpointStats, FailureKind
    from harvest.aiohttp_transport import AiohttpTransport
    from harvest.transport import (
        Interrupted,
        MockTransport,
        RawResponse,
        TimedOut,
        Transport,
        TransportError,
        Unreachable,
    )

#: name -> module: what ``from harvest.client import X`` reads, each module imported on first use
#: (``harvest stop`` and ``harvest ps`` reach :class:`EngineLimit` without aiohttp's import).
_LAZY = {
    "Client": "harvest.client.core", "EngineLimit": "harvest.client.engine", "RetryPolicy": "harvest.client.policy",
    "LOAD_METRICS": "harvest.client.metrics", "MetricsFormatError": "harvest.client.metrics",
    "Sample": "harvest.client.metrics", "parse_prometheus_text": "harvest.client.metrics",
    "scrape_metrics": "harvest.client.metrics", "sum_by_name": "harvest.client.metrics",
    **{name: "harvest.client.records" for name in ("ClientStats", "Completion", "EndpointState", "EndpointStats",
                                                    "FailureKind")},
    "AiohttpTransport": "harvest.aiohttp_transport",
    **{name: "harvest.transport" for name in ("Interrupted", "MockTransport", "RawResponse",
                                               "TimedOut", "Transport", "TransportError", "Unreachable")},
}


__getattr__ = lazy(__name__, _LAZY)

__all__ = [
    "AiohttpTransport",
    "Client",
    "ClientStats",
    "Completion",
    "EngineLimit",
    "EndpointState",
    "EndpointStats",
    "FailureKind",
    "Interrupted",
    "LOAD_METRICS",
    "MetricsFormatError",
    "MockTransport",
    "RawResponse",
    "RetryPolicy",
    "Sample",
    "TimedOut",
    "Transport",
    "TransportError",
    "Unreachable",
    "parse_prometheus_text",
    "scrape_metrics",
    "sum_by_name",
]
