"""Read an engine's Prometheus ``/metrics``: running and queued requests, token counters, cache use.

``prometheus_client``'s parser for the Prometheus text exposition format (version 0.0.4, and the
OpenMetrics lines engines emit: ``# EOF``, exemplars, quoted UTF-8 metric names) plus a scraper that
sums each metric over its labels, e.g. ``vllm:num_requests_running`` or ``sglang:num_running_reqs``. It only
reads; it never changes the server, and an engine without ``/metrics`` (404) gives an empty dict.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

# prometheus_client's parser instead of a hand-written one. Measured on vLLM CPU's real
# /metrics (51,915 bytes, 440 samples; bench/metrics_parse.py, load 18 on 2 cores): 55.5 ms per parse
# against 37.3 ms for the hand-written parser (x1.49), the same sums by name. The steering loop
# parses only the lines it reads (keep_only), so the difference is paid by full scrapes alone.
from prometheus_client.parser import text_string_to_metric_families

from harvest.client.endpoints import endpoint_url
from harvest.aiohttp_transport import AiohttpTransport
from harvest.transport import Transport, TransportError
from harvest.errors import ProbeError, ServerSick

#: Gauges that say how busy an engine is, by engine (what a progress display shows).
LOAD_METRICS: Mapping[str, tuple[str, str]] = {
    "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting"),
    "sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
}


#: Prefix-cache counters (tokens looked up / found in the cache), as the parser names their
#: samples: vLLM 0.32 ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits`` (counters, so
#: ``_total``; read from its ``v1/metrics/loggers.py`` and seen on a live vLLM 0.32 CPU server's
#: /metrics as ``vllm:prefix_cache_queries_total{engine="0",model_name=...}``). SGLang exports a gauge instead,
#: ``sglang:cache_hit_rate`` (0..1, its production metrics page).
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries")
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits")
PREFIX_RATE = ("sglang:cache_hit_rate",)
PREFIX_CACHE_NAMES = frozenset(PREFIX_QUERIES + PREFIX_HITS + PREFIX_RATE)


class PrefixCacheMeter:
    """The engines' prefix-cache hit rate over this run, from successive scrapes of every endpoint.

    Counters (vLLM) count from the first scrape this meter saw, not from the engine's start (it may
    have served another run); a counter that went back (a restarted engine) starts a new baseline and
    keeps what was counted before. Engines with only a gauge (SGLang) give their last value, averaged
    over endpoints, when no counter speaks. Never does I/O.
    """

    def __init__(self) -> None:
        #: url -> (hits, queries) at the baseline, last seen, and counted before a restart.
        self._base: dict[str, tuple[float, float]] = {}
        self._last: dict[str, tuple[float, float]] = {}
        self._carried: dict[str, tuple[float, float]] = {}
        self._gauges: dict[str, float] = {}

    def observe(self, scraped: Mapping[str, Mapping[str, float]]) -> None:
        """One scrape: endpoint URL -> metrics summed by name."""
        for url, values in scraped.items():
            hits = _first(values, PREFIX_HITS)
            queries = _first(values, PREFIX_QUERIES)
            if hits is not None and queries is not None:
                last = self._last.get(url)
                if last is None:
                    self._base[url] = (hits, queries)
                elif hits < last[0] or queries < last[1]:  # restarted: keep what it counted, count anew
                    base = self._base[url]
                    carried = self._carried.get(url, (0.0, 0.0))
                    self._carried[url] = (carried[0] + last[0] - base[0], carried[1] + last[1] - base[1])
                    self._base[url] = (0.0, 0.0)
                self._last[url] = (hits, queries)
            rate = _first(values, PREFIX_RATE)
            if rate is not None:
                self._gauges[url] = rate

    def totals(self) -> tuple[float, float]:
        """Prompt tokens found in the cache and looked up, since this meter's first scrape."""
        hits = queries = 0.0
        for url, (h, q) in self._last.items():
            base = self._base[url]
            carried = self._carried.get(url, (0.0, 0.0))
            hits += h - base[0] + carried[0]
            queries += q - base[1] + carried[1]
        return hits, queries

    def hit_rate(self) -> float | None:
        """Hits / queries over the run; the gauges' mean without counters; None when neither speaks."""
        hits, queries = self.totals()
        if queries > 0:
            return hits / queries
        if self._gauges:
            return sum(self._gauges.values()) / len(self._gauges)
        return None

    def snapshot(self) -> dict[str, float | None]:
        """For progress.json: ``hit_rate`` and, with counters, ``hit_tokens`` / ``query_tokens``."""
        hits, queries = self.totals()
        rate = self.hit_rate()
        return {"hit_rate": None if rate is None else round(rate, 4),
                "hit_tokens": hits if self._last else None, "query_tokens": queries if self._last else None}


def _first(values: Mapping[str, float], names: tuple[str, ...]) -> float | None:
    for name in names:
        value = values.get(name)
        if value is not None and not math.isnan(value):
            return float(value)
    return None


@dataclass(frozen=True)
class Sample:
    """One line of the exposition: a metric name, its labels and its value."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


class MetricsFormatError(ValueError):
    """A line of the exposition does not follow the text format (``line_number`` 0: not one line)."""

    def __init__(self, line_number: int, line: str, reason: str):
        self.line_number, self.line, self.reason = line_number, line, reason
        shown = line if len(line) <= 120 else line[:117] + "..."
        super().__init__(f"line {line_number}: {reason}: {shown!r}")


def parse_prometheus_text(text: str) -> list[Sample]:
    """Every sample in ``text`` (comments, HELP, TYPE and ``# EOF`` skipped), parsed by
    ``prometheus_client``; a malformed line raises :class:`MetricsFormatError` naming it."""
    try:
        return [Sample(sample.name, tuple(sample.labels.items()), float(sample.value))
                for family in text_string_to_metric_families(text) for sample in family.samples]
    except ValueError as exc:  # the library names the fault, not the line: find the line
        raise _locate(text, exc) from None


def _locate(text: str, exc: ValueError) -> MetricsFormatError:
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            for _ in text_string_to_metric_families(line + "\n"):
                pass
        except ValueError as line_exc:
            return MetricsFormatError(number, line, str(line_exc) or type(line_exc).__name__)
    return MetricsFormatError(0, "", str(exc))


def keep_only(text: str, names: Collection[str]) -> str:
    """The lines of ``text`` whose metric name is one of ``names`` (comments dropped): the steering
    loop reads six gauges out of an exposition of hundreds of histogram lines."""
    wanted = tuple(names)
    out = []
    for line in text.splitlines():
        if line.startswith(wanted):
            cut = len(line.split("{", 1)[0].split(" ", 1)[0])
            if line[:cut] in names:
                out.append(line)
    return "\n".join(out) + "\n"


def sum_by_name(samples: Iterable[Sample]) -> dict[str, float]:
    """Each metric name's samples added up over all label sets (NaN samples are left out)."""
    totals: dict[str, float] = {}
    for sample in samples:
        if math.isnan(sample.value):
            continue
        totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


async def scrape_metrics(base_url: str, *, timeout: float = 5.0, transport: Transport | None = None,
                         headers: Mapping[str, str] | None = None,
                         only: Collection[str] | None = None) -> dict[str, float]:
    """``GET base_url/metrics`` summed by metric name; {} when the server has no /metrics (404).
    ``only``: parse just the samples of these metric names (the rest of the text is not parsed).

    Raises :class:`ServerSick` when the server cannot be reached or answers 5xx, and
    :class:`ProbeError` when the answer is not the Prometheus text format. ``transport`` is reused
    when given (the client passes its own) and otherwise opened and closed for this one call.
    """
    head, sep, query = base_url.partition("?")  # a query (a key the endpoint takes there) stays last
    base = head.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    base += sep + query
    url = endpoint_url(base, "/metrics")
    own = transport is None
    active: Transport = transport or AiohttpTransport(max_connections=1)
    try:
        try:
            response = await active.request("GET", url, headers=headers, timeout=timeout)
        except TransportError as exc:
            raise ServerSick(f"metrics not readable: {exc}", endpoint=base) from None
    finally:
        if own:
            await active.aclose()
    if response.status == 404:
        return {}
    if response.status >= 500:
        raise ServerSick(f"GET /metrics answered HTTP {response.status}", endpoint=base, status=response.status)
    if response.status != 200:
        raise ProbeError(f"GET /metrics answered HTTP {response.status}", call=f"GET {url}")
    try:
        text = response.body.decode("utf-8", errors="replace")
        return sum_by_name(parse_prometheus_text(keep_only(text, only) if only is not None else text))
    except MetricsFormatError as exc:
        raise ProbeError(f"/metrics is not Prometheus text: {exc}", call=f"GET {url}") from None


__all__ = [
    "LOAD_METRICS",
    "PREFIX_CACHE_NAMES",
    "MetricsFormatError",
    "PrefixCacheMeter",
    "Sample",
    "keep_only",
    "parse_prometheus_text",
    "scrape_metrics",
    "sum_by_name",
]
