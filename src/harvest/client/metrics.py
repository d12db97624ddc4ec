"""Read an engine's Prometheus ``/metrics``: running and queued requests, token counters, cache use.

A small parser for the Prometheus text exposition format (version 0.0.4, and the OpenMetrics
lines engines emit: ``# EOF``, exemplars, quoted UTF-8 metric names) plus a scraper that sums each
metric over its labels, e.g. ``vllm:num_requests_running`` or ``sglang:num_running_reqs``. It only
reads; it never changes the server, and an engine without ``/metrics`` (404) gives an empty dict.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from harvest.client.transport import AiohttpTransport, Transport, TransportError
from harvest.errors import ProbeError, ServerSick

#: Gauges that say how busy an engine is, by engine (what a progress display shows).
LOAD_METRICS: Mapping[str, tuple[str, str]] = {
    "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting"),
    "sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
}

_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


@dataclass(frozen=True)
class Sample:
    """One line of the exposition: a metric name, its labels and its value."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


class MetricsFormatError(ValueError):
    """A line of the exposition does not follow the text format."""

    def __init__(self, line_number: int, line: str, reason: str):
        self.line_number, self.line, self.reason = line_number, line, reason
        shown = line if len(line) <= 120 else line[:117] + "..."
        super().__init__(f"line {line_number}: {reason}: {shown!r}")


def parse_prometheus_text(text: str) -> list[Sample]:
    """Every sample in ``text``. Comments (HELP, TYPE, EOF) are skipped; a malformed line raises
    :class:`MetricsFormatError` naming it."""
    samples = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        samples.append(_parse_line(line, number))
    return samples


def _parse_line(line: str, number: int) -> Sample:
    pos = 0
    name = ""
    labels: list[tuple[str, str]] = []
    if line[0] != "{":
        while pos < len(line) and line[pos] not in "{ \t":
            pos += 1
        name = line[:pos]
        if not _valid_name(name, metric=True):
            raise MetricsFormatError(number, line, "bad metric name")
    brace = pos
    while brace < len(line) and line[brace] in " \t":
        brace += 1  # Prometheus accepts blanks between a name and its labels
    if brace < len(line) and line[brace] == "{":
        pos, name, labels = _parse_labels(line, brace + 1, number, name)
    rest = line[pos:]
    if not rest or rest[0] not in " \t":
        raise MetricsFormatError(number, line, "no value after the name")
    rest = rest.split(" # ", 1)[0]  # OpenMetrics exemplar
    fields = rest.split()
    if not fields or len(fields) > 2:
        raise MetricsFormatError(number, line, "expected a value and an optional timestamp")
    try:
        value = float(fields[0])
    except ValueError:
        raise MetricsFormatError(number, line, f"value {fields[0]!r} is not a number") from None
    return Sample(name, tuple(labels), value)


def _parse_labels(line: str, pos: int, number: int, name: str) -> tuple[int, str, list[tuple[str, str]]]:
    """Parse ``label="value", ...}`` from ``pos``; a bare quoted string is the (UTF-8) metric name."""
    labels: list[tuple[str, str]] = []
    end = len(line)
    while True:
        while pos < end and line[pos] in " \t":
            pos += 1
        if pos >= end:
            raise MetricsFormatError(number, line, "unterminated label set")
        if line[pos] == "}":
            return pos + 1, name, labels
        if line[pos] == '"':
            pos, key = _parse_quoted(line, pos, number)
            quoted_key = True
        else:
            start = pos
            while pos < end and (line[pos].isalnum() or line[pos] == "_"):
                pos += 1
            key = line[start:pos]
            quoted_key = False
            if not _valid_name(key, metric=False):
                raise MetricsFormatError(number, line, "bad label name")
        while pos < end and line[pos] in " \t":
            pos += 1
        if quoted_key and pos < end and line[pos] in ",}":
            if name:
                raise MetricsFormatError(number, line, "two metric names")
            name = key
        else:
            if pos >= end or line[pos] != "=":
                raise MetricsFormatError(number, line, "expected '=' after a label name")
            pos += 1
            while pos < end and line[pos] in " \t":
                pos += 1
            if pos >= end or line[pos] != '"':
                raise MetricsFormatError(number, line, "label value must be quoted")
            pos, value = _parse_quoted(line, pos, number)
            labels.append((key, value))
        while pos < end and line[pos] in " \t":
            pos += 1
        if pos < end and line[pos] == ",":
            pos += 1
        elif pos >= end or line[pos] != "}":
            raise MetricsFormatError(number, line, "expected ',' or '}' in the label set")


def _parse_quoted(line: str, pos: int, number: int) -> tuple[int, str]:
    """Parse a double-quoted string starting at ``line[pos] == '"'``; return (position after it, text)."""
    out = []
    pos += 1
    end = len(line)
    while pos < end:
        char = line[pos]
        if char == "\\":
            if pos + 1 >= end:
                break
            nxt = line[pos + 1]
            out.append(_ESCAPES.get(nxt, "\\" + nxt))
            pos += 2
        elif char == '"':
            return pos + 1, "".join(out)
        else:
            out.append(char)
            pos += 1
    raise MetricsFormatError(number, line, "unterminated quoted string")


def _valid_name(name: str, *, metric: bool) -> bool:
    if not name or name[0].isdigit():
        return False
    extra = "_:" if metric else "_"
    return all(c.isascii() and (c.isalnum() or c in extra) for c in name)


def sum_by_name(samples: Iterable[Sample]) -> dict[str, float]:
    """Each metric name's samples added up over all label sets (NaN samples are left out)."""
    totals: dict[str, float] = {}
    for sample in samples:
        if math.isnan(sample.value):
            continue
        totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


async def scrape_metrics(base_url: str, *, timeout: float = 5.0, transport: Transport | None = None,
                         headers: Mapping[str, str] | None = None) -> dict[str, float]:
    """``GET base_url/metrics`` summed by metric name; {} when the server has no /metrics (404).

    Raises :class:`ServerSick` when the server cannot be reached or answers 5xx, and
    :class:`ProbeError` when the answer is not the Prometheus text format. ``transport`` is reused
    when given (the client passes its own) and otherwise opened and closed for this one call.
    """
    base = base_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    url = base + "/metrics"
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
        return sum_by_name(parse_prometheus_text(response.body.decode("utf-8", errors="replace")))
    except MetricsFormatError as exc:
        raise ProbeError(f"/metrics is not Prometheus text: {exc}", call=f"GET {url}") from None


__all__ = [
    "LOAD_METRICS",
    "MetricsFormatError",
    "Sample",
    "parse_prometheus_text",
    "scrape_metrics",
    "sum_by_name",
]
