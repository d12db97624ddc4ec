"""harvest's own ``/metrics`` for Prometheus while a run goes: ``[client] metrics_port``.

    metrics = RunMetrics(ledger_path=lambda: folder.via(), labels={...})
    metrics.serve("127.0.0.1", 9400)       # a thread of prometheus_client's; port 0: the system picks
    progress.metrics = metrics             # items, tokens, latencies, errors as they come
    metrics.observe(client_stats, targets) # gauges per endpoint, every progress update
    metrics.close()

prometheus_client (already the project's library for the engines' metrics) keeps the counters,
gauges and histograms in a registry of the run's own (none module-wide) and serves them from its
thread, so a scrape is answered while the event loop is busy. Names follow Prometheus' conventions
(docs/metrics.md lists them): ``harvest_`` prefix, base units in the name (``_seconds``), counters
ending ``_total``. The items by status are not counted here: at each scrape they are read from the
ledger's tallies (a read-only connection, a few rows), so they are what ``harvest status --json``
says at that moment, across every session of the run:

    harvest_items_total{status="done"|"truncated"|"failed"|"skipped"}   counter
    harvest_items_remaining{status="pending"|"running"}                 gauge

This module never writes to the run folder and never blocks the loop on more than a lock.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from harvest.errors import LedgerError
from harvest.ledger import Ledger, Status
from harvest.redact import redact_text
from harvest.version import __version__

log = logging.getLogger("harvest.campaign")

FINAL = (Status.DONE, Status.TRUNCATED, Status.FAILED, Status.SKIPPED)
REMAINING = (Status.PENDING, Status.RUNNING)
#: Latency buckets (seconds): a tiny model's 20 ms to a long answer's 20 minutes.
LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60, 120, 300, 600, 1200, math.inf)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, math.inf)
TPOT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, math.inf)


class _LedgerItems(Collector):
    """The items by status, read from the ledger at each scrape (see the module docstring)."""

    def __init__(self, ledger_path: Callable[[], str]):
        self._ledger_path = ledger_path

    def collect(self) -> Iterator[Metric]:
        done = CounterMetricFamily("harvest_items", "Items in each final status, as the run's ledger holds "
                                   "them at the scrape (every session of the run)", labels=["status"])
        left = GaugeMetricFamily("harvest_items_remaining", "Items not settled yet, as the ledger holds them "
                                 "at the scrape: pending, and running (claimed, in flight)", labels=["status"])
        try:
            ledger = Ledger.open_readonly(self._ledger_path())
            try:
                counts = ledger.counts()
            finally:
                ledger.close()
        except (LedgerError, OSError) as exc:  # a scrape never fails for it: the families come empty
            log.debug("metrics: the ledger was not read: %s", exc)
            counts = None
        if counts is not None:
            for s in FINAL:
                done.add_metric([s.value], counts[s])
            for s in REMAINING:
                left.add_metric([s.value], counts[s])
        yield done
        yield left

    def describe(self) -> Iterator[Metric]:  # the names, without reading the ledger at registration
        yield CounterMetricFamily("harvest_items", "", labels=["status"])
        yield GaugeMetricFamily("harvest_items_remaining", "", labels=["status"])


class RunMetrics:
    """The metrics of one session (see the module docstring); fed from the loop, read from the
    server's thread (prometheus_client's metrics are thread-safe)."""

    def __init__(self, ledger_path: Callable[[], str], *, run_dir: str, model: str | None = None):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        r.register(_LedgerItems(ledger_path))
        Gauge("harvest_run_info", "The run this harvest serves metrics of", ["run_dir", "version"], registry=r) \
            .labels(redact_text(run_dir), __version__).set(1)
        self.settled = Counter("harvest_session_items", "Items this session settled, by final status",
                               ["status"], registry=r)
        self.generated = Counter("harvest_generated_tokens", "Completion tokens generated (this session)", registry=r)
        self.prompt = Counter("harvest_prompt_tokens", "Prompt tokens sent (this session)", registry=r)
        self.latency = Histogram("harvest_request_duration_seconds", "Seconds from an item's requests being "
                                 "sent to its answer", buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("harvest_time_to_first_token_seconds", "Streamed answers: seconds to the first "
                              "token", buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("harvest_time_per_output_token_seconds", "Streamed answers: seconds per output "
                              "token after the first", buckets=TPOT_BUCKETS, registry=r)
        self.errors = Counter("harvest_errors", "Failed requests by error class (http_400, timeout, "
                              "server_sick, ...)", ["error_class"], registry=r)
        self.relaunches = Counter("harvest_server_relaunches", "Relaunches of the server harvest manages",
                                  registry=r)
        self.hangs = Counter("harvest_endpoint_hangs", "Times an endpoint was found holding requests with "
                             "nothing back (hung, or frozen with /health silent)", ["endpoint"], registry=r)
        self.in_flight = Gauge("harvest_requests_in_flight", "Requests on the wire to each endpoint",
                               ["endpoint"], registry=r)
        self.concurrency = Gauge("harvest_concurrency_limit", "Requests each endpoint may hold: concurrency "
                                 "= \"auto\"'s target, or the fixed limit (endpoint \"all\")", ["endpoint"], registry=r)
        self.healthy = Gauge("harvest_endpoint_healthy", "1 while the endpoint takes requests, else 0 (sick, "
                             "hung, down)", ["endpoint"], registry=r)
        self.claimed = Gauge("harvest_items_claimed", "Items claimed from the ledger: on the wire or waiting "
                             "in harvest's queue", registry=r)
        self.eta = Gauge("harvest_eta_seconds", "Seconds until every item is settled at the recent rate "
                         "(NaN while unknown, e.g. nothing comes back)", registry=r)
        self._lock = threading.Lock()
        self._server: Any = None  # prometheus_client's WSGIServer
        self._thread: threading.Thread | None = None
        self.url: str | None = None

    # --- serving -------------------------------------------------------------------------------

    def serve(self, host: str, port: int) -> str:
        """Start serving ``/metrics``; returns its URL. OSError when the address cannot be bound."""
        server, thread = start_http_server(port, addr=host, registry=self.registry)
        self._server, self._thread = server, thread
        bound = server.server_address[1]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{bound}/metrics"
        return self.url

    def close(self) -> None:
        """Stop serving (bounded: the server's loop ends within its poll interval)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    # --- feeding -------------------------------------------------------------------------------

    def item(self, status: str, prompt_tokens: int, completion_tokens: int, latency_s: float | None) -> None:
        self.settled.labels(status).inc()
        if 0 <= completion_tokens < 2**31:
            self.generated.inc(completion_tokens)
        if 0 <= prompt_tokens < 2**31:
            self.prompt.inc(prompt_tokens)
        if latency_s is not None and math.isfinite(latency_s) and latency_s >= 0:
            self.latency.observe(latency_s)

    def stream_times(self, ttft_s: float | None, tpot_s: float | None) -> None:
        if ttft_s is not None and math.isfinite(ttft_s) and ttft_s >= 0:
            self.ttft.observe(ttft_s)
        if tpot_s is not None and math.isfinite(tpot_s) and tpot_s >= 0:
            self.tpot.observe(tpot_s)

    def error(self, error_class: str) -> None:
        self.errors.labels(error_class).inc()

    def relaunched(self) -> None:
        self.relaunches.inc()

    def hung(self, endpoint: str) -> None:
        self.hangs.labels(redact_text(endpoint)).inc()

    def observe(self, snap: Mapping[str, Any], stats: Any) -> None:
        """The gauges from a progress snapshot and the client's stats (``ClientStats`` or None)."""
        self.claimed.set(snap.get("in_flight") or 0)
        eta = snap.get("eta_s")
        self.eta.set(float(eta) if isinstance(eta, (int, float)) else math.nan)
        targets = snap.get("concurrency_targets") or {}
        if snap.get("concurrency"):
            self.concurrency.labels("all").set(snap["concurrency"])
        for url, target in targets.items():
            self.concurrency.labels(redact_text(url)).set(target)
        if stats is None:
            return
        for e in stats.endpoints:
            shown = redact_text(e.url)
            self.in_flight.labels(shown).set(e.outstanding)
            self.healthy.labels(shown).set(1 if e.state.value == "healthy" and not e.hung else 0)


__all__ = ["RunMetrics"]
