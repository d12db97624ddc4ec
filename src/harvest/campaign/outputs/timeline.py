"""What a run looked like over time, kept bounded in size however many items it has: ``timeline.json``.

    tl = Timeline.open(run_dir)      # continues the file an earlier session of the run wrote
    tl.item("done", latency_s, prompt_tokens, completion_tokens)    # per finished item, O(1)
    tl.observe_metrics(scraped)      # each endpoint's running / waiting / KV use from /metrics
    tl.interval(progress_snapshot)   # every progress interval (the same snapshot as progress.json)
    tl.launch(server) / tl.stop(report)
    tl.close("finished")
    read_timeline(run_dir)           # the document, for ``harvest report``

Bounds (a run of 10^7 items writes the same few hundred KB as a run of 10^3):

- intervals: at most :data:`MAX_POINTS`. When the list would pass it, neighbouring intervals of the
  same session are merged pairwise (counts summed, rates and gauges averaged over their seconds)
  and from then on one point covers twice as many progress updates (``stride``): the resolution
  stays even over the whole run.
- per item: fixed log-scale histograms (latency, prompt tokens, completion tokens by status), not
  values. Quantiles read from them are exact to one bin (a factor of 2^(1/4), 19 %). Per item the
  runner only appends three numbers to a typed array (P3's results/s must hold); they are binned
  with numpy at each interval, or every :data:`FLUSH_EVERY` items (numpy is imported where binning
  starts, so a command that only reads a timeline starts without it).
- launches: one entry per server launch of the run (its record and, once stopped, its StopReport);
  at most :data:`MAX_LAUNCHES`, the oldest dropped first.

The file is written atomically (temporary file + rename) at most every :data:`WRITE_EVERY_S`
seconds and at :meth:`Timeline.close`. Recording must never end a run: a write that fails is
logged once and retried at the next interval. This module only reads the ledger's numbers as the
runner hands them over; it never opens the ledger.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from array import array
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harvest import safefiles
from harvest.errors import UnsafePathError
from harvest.redact import redact_doc

if TYPE_CHECKING:  # the report reads timelines without loading the placement layer
    import numpy as np
    from harvest.placement import Fleet
    from harvest.stops import StopReport

log = logging.getLogger("harvest.campaign")

TIMELINE_FILE = "timeline.json"
TIMELINE_SCHEMA = "harvest.timeline/1"
#: Most intervals kept; past it, neighbours are merged pairwise (see the module docstring).
MAX_POINTS = 720
#: Most server launches kept.
MAX_LAUNCHES = 200
#: Shortest time between two writes of the file while the run goes on.
WRITE_EVERY_S = 5.0
#: Items buffered before they are binned (bounds the buffer's memory).
FLUSH_EVERY = 65_536
#: Histogram bins grow by this factor: four bins per doubling.
BIN_RATIO = 2 ** 0.25

#: What a point keeps per endpoint: its /metrics gauges, and the auto-concurrency target (absent when fixed).
ENDPOINT_KEYS = ("running", "waiting", "kv_usage", "target")
#: Gauges of each engine's /metrics: (running, waiting, KV cache use as a fraction of its capacity).
RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing")
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred")
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage",
            "llamacpp:kv_cache_usage_ratio")


class Histogram:
    """Counts in fixed log-scale bins: bin 0 holds values below ``lo`` (zero included), bin i >= 1
    holds ``[lo * r**(i-1), lo * r**i)``, the last bin everything above. O(1) to add, fixed size."""

    def __init__(self, lo: float, bins: int, counts: list[int] | None = None, total: float = 0.0,
                 maximum: float = 0.0, ratio: float = BIN_RATIO):
        self.lo = lo
        self.ratio = ratio
        self.counts = list(counts) if counts and len(counts) == bins else [0] * bins
        self.sum = total
        self.max = maximum
        self._log_lo = math.log(lo)
        self._scale = 1.0 / math.log(ratio)

    @property
    def n(self) -> int:
        return sum(self.counts)

    def add(self, x: float) -> None:
        if x < self.lo:
            i = 0
        else:
            i = min(int((math.log(x) - self._log_lo) * self._scale) + 1, len(self.counts) - 1)
        self.counts[i] += 1
        self.sum += x
        if x > self.max:
            self.max = x

    def add_many(self, values: np.ndarray) -> None:
        """``add`` for every value of a float array, binned at once."""
        if not len(values):
            return
        import numpy as np  # here, not at the top: reading a timeline (status, stop) needs no numpy

        idx = np.zeros(len(values), dtype=np.int64)
        above = values >= self.lo
        idx[above] = np.minimum((np.log(values[above]) - self._log_lo) * self._scale + 1, len(self.counts) - 1)
        for i, c in enumerate(np.bincount(idx, minlength=len(self.counts)).tolist()):
            self.counts[i] += c
        self.sum += float(values.sum())
        self.max = max(self.max, float(values.max()))

    def edges(self) -> list[float]:
        """Bin edges: ``len(counts) + 1`` values, the first 0."""
        return [0.0] + [self.lo * self.ratio ** i for i in range(len(self.counts))]

    def quantile(self, q: float) -> float | None:
        """The upper edge of the bin holding the q-quantile (None when empty)."""
        n = self.n
        if n == 0:
            return None
        rank, seen = q * n, 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= rank and c:
                return min(self.lo * self.ratio ** i, self.max) if i else min(self.lo, self.max)
        return self.max

    def to_dict(self) -> dict[str, Any]:
        return {"lo": self.lo, "ratio": self.ratio, "counts": self.counts, "sum": round(self.sum, 6),
                "max": self.max}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, lo: float, bins: int, ratio: float = BIN_RATIO) -> Histogram:
        if not isinstance(d, Mapping) or d.get("lo") != lo or len(d.get("counts") or ()) != bins \
                or d.get("ratio", BIN_RATIO) != ratio:
            return cls(lo, bins, ratio=ratio)
        return cls(lo, bins, [int(c) for c in d["counts"]], float(d.get("sum") or 0.0), float(d.get("max") or 0.0),
                   ratio)


#: Latency: 1 ms .. ~8 h; tokens: 1 .. ~3.5 M.
LATENCY = (0.001, 100)
TOKENS = (1.0, 88)
#: Streamed token timing (TTFT, TPOT, ITL): 0.1 ms .. ~4 h in bins 2 % wide, so a quantile read from
#: them (the upper edge of its bin) is within 2 % of the value.
STREAM = (0.0001, 900, 1.02)
#: The streamed timings' histograms, by name.
STREAM_NAMES = ("ttft_s", "tpot_s", "itl_s")
#: Statuses whose completion lengths get their own histogram.
LENGTH_STATUSES = ("done", "truncated", "failed")


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """One interval covering two neighbours ``a`` then ``b`` of the same session."""
    da, db = a["dt"], b["dt"]
    span = da + db or 1.0

    def avg(x: float | None, y: float | None) -> float | None:
        if x is None or y is None:
            return y if x is None else x
        return round((x * da + y * db) / span, 3)

    out = dict(b)
    out["dt"] = round(da + db, 3)
    for key in ("items", "prompt_tokens", "completion_tokens"):
        out[key] = a[key] + b[key]
    for key in ("statuses", "errors"):
        merged = Counter(a[key])
        merged.update(b[key])
        out[key] = dict(merged)
    for key in ("items_per_s", "gen_tokens_per_s", "prompt_tokens_per_s", "in_flight", "sent"):
        out[key] = avg(a.get(key), b.get(key))
    endpoints: dict[str, dict[str, float | None]] = {}
    for url in {**a["endpoints"], **b["endpoints"]}:
        ea, eb = a["endpoints"].get(url, {}), b["endpoints"].get(url, {})
        endpoints[url] = {k: avg(ea.get(k), eb.get(k)) for k in ENDPOINT_KEYS if k in ea or k in eb}
    out["endpoints"] = endpoints
    return out


class Timeline:
    """The recorder of one session (see the module docstring). Not thread-safe: the event loop's."""

    def __init__(self, run_dir: Path | safefiles.Folder, doc: dict[str, Any] | None = None, *,
                 clock: Any = time.time):
        #: The held run folder the file is written in (None: by name).
        self.folder = run_dir if isinstance(run_dir, safefiles.Folder) else None
        self.path = (run_dir.path if isinstance(run_dir, safefiles.Folder) else Path(run_dir)) / TIMELINE_FILE
        self._clock = clock
        doc = doc or {}
        self.stride = int(doc.get("stride") or 1)
        self.intervals: list[dict[str, Any]] = list(doc.get("intervals") or [])
        self.sessions: list[dict[str, Any]] = list(doc.get("sessions") or [])
        self.launches: list[dict[str, Any]] = list(doc.get("launches") or [])
        hist = doc.get("histograms") or {}
        self.latency = Histogram.from_dict(hist.get("latency_s"), *LATENCY)
        #: Seconds items waited in harvest's own queue (claimed, not yet sent): apart from latency.
        self.queue = Histogram.from_dict(hist.get("queue_s"), *LATENCY)
        self.prompt = Histogram.from_dict(hist.get("prompt_tokens"), *TOKENS)
        self.lengths = {s: Histogram.from_dict((hist.get("completion_tokens") or {}).get(s), *TOKENS)
                        for s in LENGTH_STATUSES}
        #: Streamed answers' TTFT, TPOT and ITL (``[client] stream``); empty otherwise.
        self.stream = {name: Histogram.from_dict(hist.get(name), *STREAM) for name in STREAM_NAMES}
        self.session = len(self.sessions)
        #: Where the file's writes go: None writes on the caller's thread; a session running in an
        #: event loop hands its one file-writer thread.
        self.defer: Any = None
        now = clock()
        self.sessions.append({"index": self.session, "started_at": now, "ended_at": None, "outcome": None,
                              "note": None, "pid": os.getpid()})
        # the interval being filled: deltas since the last point, and progress updates it covers
        self._statuses: Counter[str] = Counter()
        # per status: latency (-1: not measured), prompt tokens, completion tokens of unbinned items
        self._buffer: dict[str, array[float]] = {}
        self._buffered = 0
        self._errors_seen: dict[str, int] = {}
        self._prompt_tokens = self._completion_tokens = 0
        self._updates = 0
        self._pending: dict[str, Any] | None = None
        self._last_t = now
        self._endpoints: dict[str, dict[str, float | None]] = {}
        self._last_write = 0.0
        self._write_failed = False
        #: Shortest time between two writes while the run goes on (seconds of ``clock``).
        self.write_every_s = WRITE_EVERY_S

    @classmethod
    def open(cls, run_dir: Path | str | safefiles.Folder, *, clock: Any = time.time) -> Timeline:
        """The recorder for a new session of the run in ``run_dir``, continuing its timeline.json (an
        unreadable or foreign file is started afresh, with a warning: it is informative only)."""
        held = run_dir if isinstance(run_dir, safefiles.Folder) else None
        where = run_dir.path if isinstance(run_dir, safefiles.Folder) else Path(run_dir)
        path = where / TIMELINE_FILE
        doc = None
        try:
            doc = json.loads(held.read_text(TIMELINE_FILE) if held is not None else path.read_text(encoding="utf-8"))
            if not isinstance(doc, dict) or doc.get("schema") != TIMELINE_SCHEMA:
                log.warning("%s is not a %s document; starting a new timeline", path, TIMELINE_SCHEMA)
                doc = None
        except FileNotFoundError:
            pass
        except (OSError, ValueError, UnsafePathError) as exc:
            log.warning("%s unreadable (%s); starting a new timeline", path, exc)
        return cls(held if held is not None else where, doc, clock=clock)

    # --- feeding -----------------------------------------------------------------------------------

    def item(self, status: str, latency_s: float | None, prompt_tokens: int, completion_tokens: int,
             queue_s: float | None = None) -> None:
        """One item reached ``status`` after ``latency_s`` seconds of generation, measured from its
        requests being sent, having waited ``queue_s`` in harvest's own queue (O(1): buffered)."""
        buf = self._buffer.get(status)
        if buf is None:
            buf = self._buffer[status] = array("d")
        buf.extend((-1.0 if latency_s is None else latency_s, prompt_tokens, completion_tokens,
                    -1.0 if queue_s is None else queue_s))
        self._buffered += 1
        if self._buffered >= FLUSH_EVERY:
            self._flush()

    def stream_times(self, ttft_s: float | None, tpot_s: float | None, itl_s: Sequence[float]) -> None:
        """One streamed item's time to first token, time per output token and inter-token gaps."""
        if ttft_s is not None:
            self.stream["ttft_s"].add(ttft_s)
        if tpot_s is not None:
            self.stream["tpot_s"].add(tpot_s)
        if itl_s:
            import numpy as np

            self.stream["itl_s"].add_many(np.asarray(itl_s, dtype=np.float64))

    def _flush(self) -> None:
        """Bin the buffered items into the histograms and the interval's counts."""
        import numpy as np

        for status, buf in list(self._buffer.items()):
            if not buf:
                continue
            rows = np.array(buf, dtype=np.float64).reshape(-1, 4)
            # a count that is not a finite number >= 0 is unknown: counted as 0, never summed as sent
            rows[:, 1:3][~(np.isfinite(rows[:, 1:3]) & (rows[:, 1:3] >= 0) & (rows[:, 1:3] < 2**31))] = 0
            lat, prompt, completion, queued = rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3]
            self.queue.add_many(queued[queued >= 0])
            self._statuses[status] += len(lat)
            self._prompt_tokens += int(prompt.sum())
            self._completion_tokens += int(completion.sum())
            self.latency.add_many(lat[lat >= 0])
            self.prompt.add_many(prompt[prompt > 0])
            lengths = self.lengths.get(status)
            if lengths is not None:
                lengths.add_many(completion)
            self._buffer[status] = array("d")
        self._buffered = 0

    def observe_metrics(self, scraped: Mapping[str, Mapping[str, float]]) -> None:
        """Each endpoint's running / waiting requests and KV use, from one scrape of /metrics."""
        for url, values in scraped.items():
            self._endpoints[url] = {
                key: next((float(values[n]) for n in names if n in values), None)
                for key, names in (("running", RUNNING), ("waiting", WAITING), ("kv_usage", KV_USAGE))}

    def interval(self, snap: Mapping[str, Any]) -> None:
        """A progress update: ``snap`` is the snapshot written to progress.json at the same moment."""
        now = self._clock()
        self._flush()
        errors = dict(snap.get("errors_by_class") or {})
        point = {
            "t": round(now, 3), "dt": round(max(now - self._last_t, 0.0), 3), "session": self.session,
            "items": sum(self._statuses.values()), "statuses": dict(self._statuses),
            "prompt_tokens": self._prompt_tokens, "completion_tokens": self._completion_tokens,
            "errors": {k: v - self._errors_seen.get(k, 0) for k, v in errors.items()
                       if v - self._errors_seen.get(k, 0)},
            "items_per_s": snap.get("items_per_s"), "gen_tokens_per_s": snap.get("gen_tokens_per_s"),
            "prompt_tokens_per_s": snap.get("prompt_tokens_per_s"), "in_flight": snap.get("in_flight"),
            "sent": snap.get("sent"),  # on the wire; in_flight also counts the items claimed ahead
            "total": snap.get("total"),
            "final": (snap.get("final_before_session") or 0) + (snap.get("done_this_session") or 0),
            "endpoints": self._endpoint_point(snap),
        }
        self._last_t = now
        self._errors_seen = errors
        self._statuses = Counter()
        self._prompt_tokens = self._completion_tokens = 0
        self._pending = point if self._pending is None else _merge(self._pending, point)
        self._updates += 1
        if self._updates >= self.stride:
            self._push()
        if now - self._last_write >= self.write_every_s:
            self.write()

    def _endpoint_point(self, snap: Mapping[str, Any]) -> dict[str, dict[str, float | None]]:
        """Each endpoint's gauges, plus its ``concurrency = "auto"`` target when the client steers it."""
        out = {u: dict(v) for u, v in self._endpoints.items()}
        for url, target in (snap.get("concurrency_targets") or {}).items():
            out.setdefault(url, {})["target"] = float(target)
        return out

    def _push(self) -> None:
        if self._pending is None:
            return
        self.intervals.append(self._pending)
        self._pending, self._updates = None, 0
        if len(self.intervals) > MAX_POINTS:
            rolled: list[dict[str, Any]] = []
            i = 0
            while i < len(self.intervals):
                a = self.intervals[i]
                b = self.intervals[i + 1] if i + 1 < len(self.intervals) else None
                if b is not None and a["session"] == b["session"]:
                    rolled.append(_merge(a, b))
                    i += 2
                else:
                    rolled.append(a)
                    i += 1
            self.intervals = rolled
            self.stride *= 2

    def launch(self, server: Fleet) -> None:
        """A server harvest launched is ready: its record (where it is on this machine), readiness
        time and KV capacity."""
        entry: dict[str, Any] = {"session": self.session, "launched_at": self._clock(), "stop": None}
        rec = server.launch_record()
        if rec is not None:
            entry.update(engine=rec.engine, engine_version=rec.engine_version, pid=rec.pid, url=rec.url,
                         gpus=list(rec.gpus), baseline_mib={str(k): v for k, v in rec.baseline_mib.items()},
                         launched_at=rec.started_at, argv=list(rec.argv), launch=rec.launch or None)
        ready = server.ready
        entry["ready_s"] = round(ready.seconds, 3) if ready is not None else None
        entry["kv_capacity_tokens"] = server.kv_capacity_tokens
        self.launches.append(entry)
        del self.launches[:-MAX_LAUNCHES]
        self.write()

    def stop(self, report: StopReport, *, leftover: bool = False, why: str | None = None) -> None:
        """A stop finished: its StopReport goes with the launch it stopped (the last one without a
        stop), or into its own entry for a server an earlier session left running; ``why``: the
        reason of a stop before a relaunch (``hung: no answer for 152 s while /health answered;
        relaunched``)."""
        doc = report.to_dict()
        doc["stopped_at"] = self._clock()
        if why is not None:
            doc["why"] = why
        if leftover:  # the launch of the session that left it, when this timeline has it (same pid)
            doc["leftover"] = True
            target = next((x for x in reversed(self.launches) if x.get("stop") is None and report.pid is not None
                           and x.get("pid") == report.pid), None)
            if target is not None:
                # the launch's row names the session that left it (the report's "session" column)
                doc["why"] = why or "left running by an earlier session; stopped as a later one began"
        else:
            target = next((x for x in reversed(self.launches) if x.get("stop") is None), None)
        if target is None:
            target = {"session": self.session, "launched_at": None, "leftover": True, "ready_s": None,
                      "engine": report.engine, "pid": report.pid}
            self.launches.append(target)
        target["stop"] = doc
        self.write()

    def close(self, outcome: str | None, note: str | None = None) -> None:
        """End the session (``note``: why it ended so): the last interval is kept whatever the
        stride, and the file written."""
        self._flush()
        self._push()
        self.sessions[-1].update(ended_at=self._clock(), outcome=outcome, note=note)
        self.write()

    # --- the file ------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {"schema": TIMELINE_SCHEMA, "stride": self.stride, "max_points": MAX_POINTS,
                "sessions": self.sessions, "intervals": self.intervals, "launches": self.launches,
                "histograms": {"latency_s": self.latency.to_dict(), "queue_s": self.queue.to_dict(),
                               "prompt_tokens": self.prompt.to_dict(),
                               "completion_tokens": {s: h.to_dict() for s, h in self.lengths.items()},
                               **{name: h.to_dict() for name, h in self.stream.items() if h.n}}}

    def write(self) -> None:
        """The document as it is now, written (through :attr:`defer` when set)."""
        self._last_write = self._clock()
        text = json.dumps(redact_doc(self.to_dict()), separators=(",", ":"))

        def put() -> None:
            try:
                if self.folder is not None:
                    self.folder.write_atomic(TIMELINE_FILE, text, fsync=False)
                else:
                    safefiles.write_atomic(self.path, text, fsync=False)
                self._write_failed = False
            except OSError as exc:  # a full disk must not end the run here; the ledger write will say so
                if not self._write_failed:
                    log.warning("%s not written: %s", self.path, exc)
                self._write_failed = True

        if self.defer is not None:
            self.defer(put)
        else:
            put()


def read_timeline(run_dir: Path | str) -> tuple[dict[str, Any] | None, str | None]:
    """``(document, None)``, ``(None, None)`` when the run has no timeline.json (a run of an older
    harvest), or ``(None, why)`` when it cannot be used."""
    path = Path(run_dir) / TIMELINE_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:
        return None, f"{path} unreadable: {exc}"
    if not isinstance(doc, dict) or doc.get("schema") != TIMELINE_SCHEMA:
        return None, f"{path} is not a {TIMELINE_SCHEMA} document"
    return doc, None


def histograms(doc: Mapping[str, Any]) -> dict[str, Histogram]:
    """The histograms of a timeline document, by name (``latency_s``, ``prompt_tokens``,
    ``completion_tokens:<status>``)."""
    hist = doc.get("histograms") or {}
    out = {"latency_s": Histogram.from_dict(hist.get("latency_s"), *LATENCY),
           "queue_s": Histogram.from_dict(hist.get("queue_s"), *LATENCY),
           "prompt_tokens": Histogram.from_dict(hist.get("prompt_tokens"), *TOKENS)}
    for status in LENGTH_STATUSES:
        out[f"completion_tokens:{status}"] = Histogram.from_dict(
            (hist.get("completion_tokens") or {}).get(status), *TOKENS)
    for name in STREAM_NAMES:
        out[name] = Histogram.from_dict(hist.get(name), *STREAM)
    return out


__all__ = [
    "MAX_POINTS",
    "RUNNING",
    "STREAM_NAMES",
    "TIMELINE_FILE",
    "TIMELINE_SCHEMA",
    "WAITING",
    "Histogram",
    "Timeline",
    "histograms",
    "read_timeline",
]
