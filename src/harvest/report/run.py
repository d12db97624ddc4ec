"""The page of a run folder: what ran, how it went over time, what came out, how each server stopped.

Sources, each read by the function that already reads it for another command, nothing recomputed:

- :func:`harvest.campaign.outputs.status.run_status` (what ``harvest status --json`` prints): counts by
  status, the totals identity, failures by class and the last errors, throughput, runner, notes;
- the ledger's meta (the job as recorded at the run's start, harvest version);
- :func:`harvest.campaign.outputs.timeline.read_timeline`: intervals (rates, in flight, each endpoint's
  queue and KV use, errors by class), the latency and length histograms, every launch with its
  StopReport. A run written by an older harvest has no timeline: its page says so and shows the
  last launch from ``server/launch.json`` and ``server/stop.json`` instead.

Only reads the run folder (the ledger read-only); never writes to it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from harvest.campaign.outputs.status import RunStatus, run_status
from harvest.campaign.outputs.timeline import Histogram, histograms, read_timeline
from harvest.ledger import Ledger, Status
from harvest.report import charts
from harvest.redact import redact_doc
from harvest.report.html import Cell, esc, figure, kv, num, seconds, table, val, when
from harvest.server.history import log_of

SERVER_DIR = "server"


def _meta(run_dir: Path) -> dict[str, Any]:
    ledger = Ledger.open_readonly(run_dir)
    try:
        return ledger.meta()
    finally:
        ledger.close()


def _last_launch_from_files(run_dir: Path) -> list[dict[str, Any]]:
    """The launch of a run without timeline.json, from the server folder's records."""
    try:
        rec = json.loads((run_dir / SERVER_DIR / "launch.json").read_text(encoding="utf-8"))["record"]
    except (OSError, ValueError, KeyError):
        return []
    entry = {"session": None, "launched_at": rec.get("started_at"), "engine": rec.get("engine"),
             "engine_version": rec.get("engine_version"), "pid": rec.get("pid"), "gpus": rec.get("gpus"),
             "baseline_mib": rec.get("baseline_mib"), "ready_s": None, "kv_capacity_tokens": None, "stop": None}
    try:
        entry["stop"] = json.loads((run_dir / SERVER_DIR / "stop.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    return [entry]


# --- sections ------------------------------------------------------------------------------------------


#: [server] settings that mean nothing for an engine kind, left out of its report: an endpoint
#: harvest did not launch has no port it binds, no readiness wait, no tensor parallelism; SGLang's
#: and vLLM's memory knobs are each other's no-ops.
_LAUNCH_ONLY = {"host", "port", "gpus", "tp", "python", "mem_fraction_static", "gpu_memory_utilization",
                "kv_cache_dtype", "enable_hierarchical_cache", "hicache_size", "hicache_ratio", "reasoning_parser",
                "max_running_requests", "dtype", "extra_args", "command", "health_url", "ready_timeout",
                "stop_grace", "stop_deadline"}
_HICACHE = {"enable_hierarchical_cache", "hicache_size", "hicache_ratio"}
NOT_APPLICABLE: dict[str, set[str]] = {
    "openai": _LAUNCH_ONLY,
    "command": {"tp", "python", "mem_fraction_static", "gpu_memory_utilization", "kv_cache_dtype", *_HICACHE,
                "reasoning_parser", "dtype", "extra_args", "base_url"},
    "sglang": {"gpu_memory_utilization", "command", "health_url", "base_url"},
    "vllm": {"mem_fraction_static", *_HICACHE, "command", "health_url", "base_url"},
    "transformers": {"mem_fraction_static", *_HICACHE, "reasoning_parser", "command", "health_url", "base_url"},
    "llamacpp": {"python", "tp", "mem_fraction_static", "gpu_memory_utilization", *_HICACHE, "reasoning_parser",
                 "dtype", "health_url", "base_url"},
}


def applicable_settings(server: dict[str, Any]) -> dict[str, Any]:
    """The [server] settings worth showing for its engine kind: set, and meaning something there."""
    skip = NOT_APPLICABLE.get(str(server.get("engine")), set())
    return {k: v for k, v in server.items() if v not in (None, [], {}, "") and k not in ("env", *skip)}


def _header(st: RunStatus, meta: dict[str, Any], launches: list[dict[str, Any]]) -> str:
    job = meta.get("job") or {}
    server = job.get("server") or {}
    data = job.get("data") or {}
    sampling = job.get("sampling") or {}
    client = job.get("client") or {}
    engine = server.get("engine") or ("endpoints" if client.get("endpoints") else None)
    version = next((x.get("engine_version") for x in reversed(launches) if x.get("engine_version")), None)
    settings = applicable_settings(server)
    asked = server.get("served_model_name") or server.get("model")
    used = st.model
    pairs = [
        ("job file", meta.get("job_file")),
        ("model", (used or asked) if used is None or asked is None or used == asked
         else f"{used} (the job names {asked})"),
        ("engine", f"{engine or '-'}" + (f" {version}" if version else "")),
        ("endpoints", ", ".join(client.get("endpoints") or []) or None),
        ("dataset", data.get("path")),
        ("concurrency", client.get("concurrency", "auto")),
        ("prefix cache hits", None if st.progress is None or st.progress.prefix_cache_hit_rate is None
         else f"{st.progress.prefix_cache_hit_rate:.1%} of prompt tokens (last session, engine counters)"),
        ("harvest version", st.harvest_version),
        ("created", when(st.created_at)),
        ("settings hash", ", ".join(st.settings_hashes) or None),
        ("runner", _runner(st)),
    ]
    out = ["<h2>Run</h2>", kv(pairs)]
    if sampling:
        out.append("<h3>Sampling settings</h3>" + settings_table(sampling, name="sampling"))
    if settings:
        out.append("<h3>Server settings</h3>" + settings_table(settings, name="server-settings"))
    return "".join(out)


def _runner(st: RunStatus) -> str:
    """The runner as measured; the process writing the page is the run itself as it ends (``harvest
    run`` writes its report last): not "alive", but ended, with the state it recorded."""
    if st.runner.pid == os.getpid():
        return (f"pid {st.runner.pid}: the harvest run that wrote this page as it ended "
                f"({st.runner.recorded_state or 'state not recorded'})")
    return st.runner.detail


def settings_table(settings: dict[str, Any], *, name: str) -> str:
    """One row per setting: its name and its value as a person reads it (lists joined, tables as
    ``key = value`` pairs, unset values left out)."""
    def shown(value: Any) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, list):
            return " ".join(str(v) for v in value) if value else "-"
        if isinstance(value, dict):
            return ", ".join(f"{k} = {json.dumps(v)}" for k, v in sorted(value.items())) if value else "-"
        return "-" if value is None else str(value)

    rows = [(k, shown(v)) for k, v in sorted(settings.items()) if v not in (None, [], {}, "")]
    return table(("setting", "value"), rows, name=name)


def _totals(st: RunStatus) -> str:
    t = st.totals
    c = st.counts
    identity = (f"{val(c[Status.DONE], 'counts.done')} done + {val(c[Status.TRUNCATED], 'counts.truncated')} "
                f"truncated + {val(c[Status.FAILED], 'counts.failed')} failed + "
                f"{val(c[Status.SKIPPED], 'counts.skipped')} skipped")
    settled = c[Status.DONE] + c[Status.TRUNCATED] + c[Status.FAILED] + c[Status.SKIPPED]
    rows_total = t.unique * st.samples  # item rows: one per sample
    mark = ('<span class="ok">= </span>' if settled == rows_total else '<span class="warn">&ne; </span>')
    verdict = ('<span class="ok" data-json="totals.ok">OK</span>' if t.ok else
               '<span class="bad" data-json="totals.ok">CHECK</span>')
    rows = [(s.value, Cell(val(c[s], f"counts.{s.value}"), True),
             f"{100 * c[s] / rows_total:.1f}%" if rows_total else "-") for s in Status]
    rows.append(("unique input", Cell(val(t.unique, "totals.unique"), True), ""))
    per = f" x {val(st.samples, 'samples_per_item')} samples" if st.samples > 1 else ""
    out = ["<h2>Totals</h2>",
           f'<p class="identity">{identity} {mark}{val(t.unique, "totals.unique")} unique input{per}: {verdict}</p>',
           f"<p>{esc(t.describe())}</p>",
           kv([("input rows", Cell(val(t.input_rows, "totals.input_rows"))),
               ("duplicates", Cell(val(t.duplicates, "totals.duplicates"))),
               ("id conflicts (same id, different content)", Cell(val(t.id_conflicts, "totals.id_conflicts"))),
               ("results", Cell(val(t.results, "totals.results"))),
               ("remaining (pending + running)", Cell(val(st.remaining, "totals.remaining"))),
               ("ingest complete", "yes" if t.ingest_complete else "no"),
               ("samples per item", Cell(val(st.samples, "samples_per_item"))),
               ("logprob storage (top-k)", Cell(f'{val(st.logprob_bytes, "logprobs.bytes")} bytes in '
                                                f'{val(st.logprob_shards, "logprobs.shards")} shards'
                                                f' (k = {val(st.logprobs_k, "logprobs.k")})'))]),
           table(("status", "items", "share"), rows, name="counts")]
    for p in t.problems:
        out.append(f'<p class="bad">{esc(p)}</p>')
    answered = c[Status.DONE] + c[Status.TRUNCATED]
    if answered and c[Status.TRUNCATED] / answered > 0.5:  # OK as a count, yet most answers are cut
        out.append(f'<p class="warn" data-note="mostly-truncated">{num(c[Status.TRUNCATED])} of {num(answered)} '
                   f'answers ({100 * c[Status.TRUNCATED] / answered:.0f}%) stopped at max_tokens: their text is '
                   f'cut. Raise [sampling] max_tokens, or find why the model does not stop (its chat template, '
                   f'its stop tokens).</p>')
    return "".join(out)


def _series(doc: dict[str, Any]) -> tuple[float, list[dict[str, Any]]]:
    """Time origin and intervals of a timeline, each with its x (minutes since the first session)."""
    sessions = doc.get("sessions") or []
    t0 = min((s["started_at"] for s in sessions if s.get("started_at")), default=0.0)
    return t0, doc.get("intervals") or []


def _broken(points: list[dict[str, Any]], t0: float, key: Any) -> tuple[list[float], list[float | None]]:
    """x (minutes) and y of one series; a None breaks the line between sessions and across a gap
    with no progress update (dispatch waiting for a relaunch), so no line is drawn through it."""
    xs: list[float] = []
    ys: list[float | None] = []
    last = None
    dts = sorted(p["dt"] for p in points)
    gap = 5 * dts[len(dts) // 2] if dts else 0.0
    for p in points:
        if last is not None and (p["session"] != last or (gap and p["dt"] > gap)):
            xs.append(xs[-1])
            ys.append(None)
        xs.append((p["t"] - t0) / 60)
        ys.append(key(p))
        last = p["session"]
    return xs, ys


def _over_time(doc: dict[str, Any], launches: list[dict[str, Any]]) -> str:
    t0, points = _series(doc)
    if not points:
        return "<h2>Over time</h2><p>No progress interval was recorded (the run ended within its first one).</p>"
    events: list[tuple[float, str, str]] = []
    spans: list[tuple[float, float, str]] = []
    for x in launches:
        if x.get("launched_at"):
            ready = x["launched_at"] + (x.get("ready_s") or 0)
            events.append(((ready - t0) / 60, "server ready", "#1a7f37"))
        stop = x.get("stop") or {}
        if stop.get("stopped_at"):
            events.append(((stop["stopped_at"] - t0) / 60, "server stopped", "#cf222e"))
    # a server down: from a stop to the next launch's readiness within the same session
    ordered = [x for x in launches if x.get("launched_at")]
    for a, b in zip(ordered, ordered[1:]):
        stopped = (a.get("stop") or {}).get("stopped_at")
        if stopped and a.get("session") == b.get("session"):
            died = min(stopped, max((p["t"] for p in points if p["t"] <= stopped), default=stopped))
            spans.append(((died - t0) / 60, (b["launched_at"] + (b.get("ready_s") or 0) - t0) / 60,
                          "server down (relaunch)"))
    rate = {"title": "throughput (progress window rates, as in progress.json)", "ylabel": "tokens/s",
            "lines": [("gen tok/s", *_broken(points, t0, lambda p: p.get("gen_tokens_per_s"))),
                      ("prompt tok/s", *_broken(points, t0, lambda p: p.get("prompt_tokens_per_s")))]}
    urls = sorted({u for p in points for u in p.get("endpoints", {})})
    if any(p.get("sent") is not None for p in points):  # as the panel: on the wire, and claimed ahead apart
        queue_lines = [("sent (on the wire)", *_broken(points, t0, lambda p: p.get("sent"))),
                       ("claimed ahead (harvest's queue)", *_broken(points, t0, lambda p: None if p.get("sent") is None
                                                                    or p.get("in_flight") is None
                                                                    else max(p["in_flight"] - p["sent"], 0)),
                        {"linestyle": "--"})]
    else:  # a timeline written before "sent" was recorded
        queue_lines = [("claimed (sent + harvest's queue)", *_broken(points, t0, lambda p: p.get("in_flight")))]
    kv_lines = []
    for u in urls:
        short = u.split("//")[-1]
        queue_lines.append((f"running {short}", *_broken(points, t0, lambda p, u=u: p["endpoints"].get(u, {})
                                                           .get("running"))))
        queue_lines.append((f"waiting {short}", *_broken(points, t0, lambda p, u=u: p["endpoints"].get(u, {})
                                                           .get("waiting"))))
        if any(p["endpoints"].get(u, {}).get("target") is not None for p in points):
            queue_lines.append((f"auto target {short}", *_broken(points, t0, lambda p, u=u: p["endpoints"]
                                                                   .get(u, {}).get("target"))))
        kv_lines.append((f"KV use {short}", *_broken(points, t0, lambda p, u=u: _pct(
            p["endpoints"].get(u, {}).get("kv_usage")))))
    panels: list[dict[str, Any]] = [rate, {"title": "requests in flight and the server queue (/metrics)", "ylabel": "requests",
                     "lines": queue_lines}]
    if any(y is not None for _, _, ys in kv_lines for y in ys):
        panels.append({"title": "KV cache use (/metrics)", "ylabel": "% of capacity", "lines": kv_lines,
                       "ylim_top": 105})
    classes = sorted({k for p in points for k in p.get("errors", {})})
    if classes:
        bars = []
        for k in classes:
            xs = [(p["t"] - p["dt"] - t0) / 60 for p in points]
            bars.append((f"errors: {k}", xs, [p.get("errors", {}).get(k, 0) for p in points],
                         [max(p["dt"], 1e-3) / 60 for p in points]))
        panels.append({"title": "errors by class per interval", "ylabel": "errors", "bars": bars})
    caption = (f"{len(points)} intervals over {len(doc.get('sessions') or [])} session(s); one point covers "
               f"{doc.get('stride', 1)} progress update(s). Dashed lines: server ready (green) and stopped (red).")
    return "<h2>Over time</h2>" + figure("over-time", charts.time_panels(panels, events=events, spans=spans),
                                         caption)


def _pct(x: float | None) -> float | None:
    return None if x is None else 100 * x


def _hist_series(h: Histogram, label: str) -> tuple[str, list[float], list[int]]:
    return label, h.edges(), h.counts


def _distributions(st: RunStatus, doc: dict[str, Any], meta: dict[str, Any]) -> str:
    hs = histograms(doc)
    lat = hs["latency_s"]
    out = ["<h2>Latency and output length</h2>"]
    rows = []
    for name, h, unit in (("latency (from sent)", lat, "seconds"), ("wait in harvest's queue", hs["queue_s"], "seconds"),
                          ("prompt tokens", hs["prompt_tokens"], "tokens"),
                          *[(f"output tokens ({s})", hs[f"completion_tokens:{s}"], "tokens")
                            for s in ("done", "truncated", "failed")],
                          ("time to first token (TTFT)", hs["ttft_s"], "seconds"),
                          ("time per output token (TPOT)", hs["tpot_s"], "seconds"),
                          ("between tokens (ITL)", hs["itl_s"], "seconds")):
        if h.n:
            rows.append((name, unit, h.n, *(num(h.quantile(q)) for q in (0.5, 0.9, 0.99)), num(h.max),
                         num(h.sum / h.n)))
    out.append(table(("measure", "unit", "items", "p50 (bin)", "p90 (bin)", "p99 (bin)", "max", "mean"), rows,
                     name="distributions"))
    out.append("<p class=\"sub\">Recorded by this harvest as items finished (quantiles to one histogram bin, "
               "19 %); items of sessions without a timeline are not in them.</p>")
    if lat.n:
        marks = [(q, f"p{int(p * 100)}") for p in (0.5, 0.99) if (q := lat.quantile(p)) is not None]
        out.append(figure("latency", charts.histograms([_hist_series(lat, "all items")], title="latency per item",
                                                        xlabel="seconds (log)", marks=marks),
                          "Seconds from each request being sent to its answer, summed over the item's "
                          "requests (retries included; the wait in harvest's own queue is apart), log bins."))
    streamed = [_hist_series(hs[name], label) for name, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"),
                                                                  ("itl_s", "ITL")) if hs[name].n]
    if streamed:
        out.append(figure("token-timing", charts.histograms(streamed, title="time to first token, per output "
                                                                          "token and between tokens",
                                                            xlabel="seconds (log)"),
                          "Streamed answers ([client] stream): seconds from each item's first request being "
                          "sent to its first token (TTFT), per output token after it (TPOT), and every gap "
                          "between two tokens (ITL); the wait in harvest's own queue is apart."))
    series = [_hist_series(hs[f"completion_tokens:{s}"], s) for s in ("done", "truncated", "failed")
              if hs[f"completion_tokens:{s}"].n]
    max_tokens = ((meta.get("job") or {}).get("sampling") or {}).get("max_tokens")
    if series:
        marks = [(float(max_tokens), f"max_tokens {max_tokens}")] if max_tokens else []
        out.append(figure("output-length", charts.histograms(series, title="output tokens per item by status",
                                                              xlabel="tokens (log)", marks=marks),
                          "Completion tokens per item, by final status."))
    c = st.counts
    answered = c[Status.DONE] + c[Status.TRUNCATED]
    rate = c[Status.TRUNCATED] / answered if answered else None
    out.append("<p>Truncation rate (finish_reason = length, of done + truncated): "
               f"<b>{'-' if rate is None else f'{100 * rate:.2f} %'}</b> "
               f"({val(c[Status.TRUNCATED], 'counts.truncated')} of {num(answered)})"
               + (f", max_tokens {esc(max_tokens)}" if max_tokens else "") + ".</p>")
    return "".join(out)


def _status_chart(st: RunStatus) -> str:
    labels = [s.value for s in Status]
    values = [float(st.counts[s]) for s in Status]
    unique = st.totals.unique * st.samples
    notes = [f"{int(v):,} ({100 * v / unique:.1f}%)" if unique else f"{int(v):,}" for v in values]
    svg = charts.hbars(labels, values, [charts.STATUS_COLORS[s] for s in labels], title="items by status",
                       xlabel="items", notes=notes)
    return "<h2>Status breakdown</h2>" + figure("status", svg, "Items per status, from the ledger.")


def _errors(st: RunStatus, doc: dict[str, Any] | None) -> str:
    out = ["<h2>Errors</h2>"]
    if st.failed_by_class:
        out.append("<h3>Failed items by class (ledger)</h3>")
        out.append(table(("class", "items"), [(k, Cell(val(v, f"failed_by_class.{k}"), True))
                                              for k, v in sorted(st.failed_by_class.items())], name="failed"))
    else:
        out.append("<p>No failed item.</p>")
    if st.skip_reasons:
        out.append("<h3>Skipped rows by reason (ledger)</h3>")
        rows = [(r.error_class, Cell(val(r.count, f"skipped_reasons.{i}.count"), True), r.reason,
                 f"{r.source or '-'}:{r.line if r.line is not None else '-'}", r.hint)
                for i, r in enumerate(st.skip_reasons)]
        out.append(table(("class", "rows", "reason", "example", "what fixes it"), rows, name="skipped"))
    if doc is not None:
        seen: dict[str, int] = {}
        for p in doc.get("intervals") or []:
            for k, v in p.get("errors", {}).items():
                seen[k] = seen.get(k, 0) + v
        if seen:
            out.append("<h3>Errors seen while running, by class (including server outages, which charge no item)</h3>")
            out.append(table(("class", "count"), sorted(seen.items()), name="errors-seen"))
    if st.last_errors:
        out.append("<h3>Examples: the most recent failures</h3>")
        examples = [(e.item_id, e.error_class, e.attempts, f"{e.source or '-'}:{e.source_line or '-'}",
                     Cell("<pre>" + esc(e.message[:600]) + "</pre>")) for e in st.last_errors]
        out.append(table(("item", "class", "attempts", "source", "message"), examples, name="last-errors"))
    return "".join(out)


def sessions_section(doc: dict[str, Any]) -> str:
    """Every session of the run (timeline.json): when it ran, its runner's pid, the items it settled,
    and how it ended, with why; one that recorded no end was killed (or its machine stopped)."""
    sessions = doc.get("sessions") or []
    items: dict[Any, int] = {}
    for p in doc.get("intervals") or []:
        items[p.get("session")] = items.get(p.get("session"), 0) + int(p.get("items") or 0)
    rows = []
    for i, x in enumerate(sessions):
        ended = x.get("ended_at") is not None
        how = (f"{x.get('outcome') or '-'}" + (f": {x['note']}" if x.get("note") else "")) if ended else \
            "no end recorded: killed or crashed (the next session put what it left running back to pending)"
        cls = "ok" if x.get("outcome") == "finished" else "bad"
        rows.append((x.get("index", i), when(x.get("started_at")), when(x.get("ended_at")),
                     Cell(esc(x.get("pid") if x.get("pid") is not None else "-"), numeric=True),
                     Cell(f"{items.get(x.get('index', i), 0):,}", numeric=True),
                     Cell(f'<span class="{cls}" data-session-end="{esc(x.get("outcome"))}">{esc(how)}</span>')))
    return "<h2>Sessions</h2>" + table(("session", "started", "ended", "runner pid", "items settled",
                                        "how it ended"), rows, name="sessions")


def _ended(x: dict[str, Any]) -> str:
    """How a launch ended: its stop and why (a crash, a hang, a leftover), or still running."""
    stop = x.get("stop")
    if not stop:
        return "no stop recorded (running, or stopped as a leftover by a later session)"
    why = stop.get("why") or ("the run's end" if not stop.get("leftover") else "left running by an earlier session")
    return f"stopped ({why}): {stop.get('verdict') or '-'}"


def _log_link(run_dir: Path | None, x: dict[str, Any], link_base: str) -> Cell:
    """A link to the launch's log, where it is kept now (``server/launches/N/server.log``)."""
    number = x.get("launch")
    if run_dir is None or not isinstance(number, int):
        return Cell("-")
    found = log_of(run_dir / SERVER_DIR, number)
    if found is None:
        return Cell("not kept")
    rel = os.path.join(link_base, os.path.relpath(found, run_dir)) if link_base else os.path.relpath(found, run_dir)
    return Cell(f'<a href="{esc(rel)}" data-launch-log="{number}">{esc(os.path.relpath(found, run_dir))}</a>')


def launches_section(launches: list[dict[str, Any]], *, title: str = "Server launches and stops",
                     run_dir: Path | None = None, link_base: str = "") -> str:
    """Each launch (its number in the folder, pid, readiness, KV capacity), how it ended, a link to
    its log (``run_dir`` given), and its StopReport: verdict, timings, GPU memory per GPU."""
    out = [f"<h2>{esc(title)}</h2>"]
    if not launches:
        return out[0] + "<p>No server was launched by harvest for this folder.</p>"
    rows = []
    for i, x in enumerate(launches, start=1):
        stop = x.get("stop") or {}
        verdict = stop.get("verdict")
        cls = "ok" if verdict == "clean" else "bad"
        rows.append((i, x.get("label") or x.get("session"), when(x.get("launched_at")),
                     f"{x.get('engine') or '-'} {x.get('engine_version') or ''}".strip(),
                     Cell(esc(x.get("pid") if x.get("pid") is not None else "-"), numeric=True),  # 19548, not 19,548
                     seconds(x.get("ready_s")), x.get("kv_capacity_tokens"),
                     Cell(f'<span class="{cls}" data-stop-verdict="{esc(verdict)}">{esc(verdict or "-")}</span>'),
                     seconds(stop.get("total_s")), "yes" if stop.get("escalated") else "no", _ended(x),
                     _log_link(run_dir, x, link_base)))
    out.append(table(("#", "session / label", "launched", "engine", "pid", "ready in", "KV tokens", "stop",
                      "stop took", "SIGKILL", "how it ended", "log"), rows, name="launches"))
    for i, x in enumerate(launches, start=1):
        stop = x.get("stop")
        if not stop:
            continue
        out.append(f"<h3>Stop of launch {i}: {esc(stop.get('verdict'))} in {esc(seconds(stop.get('total_s')))}"
                   f" (deadline {esc(seconds(stop.get('deadline_s')))})</h3>")
        if stop.get("why"):  # stopped to be relaunched: the server died, or hung
            out.append(f'<p class="why-stopped">Stopped because {esc(stop["why"])}.</p>')
        steps = [(s.get("name"), seconds(s.get("duration_s")), "ok" if s.get("ok", True) else "NOT OK",
                  s.get("outcome")) for s in stop.get("steps") or []]
        if steps:
            out.append(table(("step", "took", "", "outcome"), steps))
        base, final = stop.get("baseline_mib") or {}, stop.get("final_mib") or {}
        gpus = sorted({*base, *final}, key=lambda g: int(g))
        if gpus:
            out.append(table(("GPU", "MiB before launch", "MiB after stop"),
                             [(g, base.get(g), final.get(g)) for g in gpus]))
        else:
            out.append("<p>GPU memory: no GPU was used by this server.</p>")
        for p in stop.get("problems") or []:
            out.append(f'<p class="bad">{esc(p)}</p>')
        if stop.get("port_open"):
            out.append('<p class="bad">the port was still in use at the end of the stop</p>')
    return "".join(out)


def run_page(run_dir: str | Path, *, shown_as: Path | None = None, link_base: str = "") -> tuple[str, str, list[str]]:
    """(title, subtitle, sections) of the run in ``run_dir``; LedgerError when it holds no ledger.
    ``shown_as``: the folder's name on the page, when ``run_dir`` is a path through its descriptor;
    ``link_base``: the run folder as seen from the page's own folder ("" when the page is in it),
    for the links to the launches' logs."""
    run_dir = Path(run_dir)
    name = shown_as if shown_as is not None else run_dir
    st = run_status(run_dir)
    # Records written by an older harvest may hold what is now redacted (a URL's user part, a query
    # key): the page redacts again what it reads.
    meta = redact_doc(_meta(run_dir))
    doc, problem = read_timeline(run_dir)
    doc = redact_doc(doc) if doc is not None else None
    launches = list(doc.get("launches") or []) if doc is not None else _last_launch_from_files(run_dir)
    sections = [_header(st, meta, launches), _totals(st), _status_chart(st)]
    if doc is not None:
        sections.append(_over_time(doc, launches))
        sections.append(_distributions(st, doc, meta))
    else:
        sections.append("<h2>Over time</h2><p>" + esc(problem or "This run has no timeline.json (written by an "
                                                     "older harvest): no time series or distributions.") + "</p>")
    sections.append(_errors(st, doc))
    if doc is not None:
        sections.append(sessions_section(doc))
    sections.append(launches_section(launches, run_dir=run_dir, link_base=link_base))
    for note in st.notes:
        sections.append(f'<p class="sub">note: {esc(note)}</p>')
    t = st.totals
    subtitle = (f"{name} - {t.unique:,} unique items, {st.settled:,} settled - "
                f"{'totals OK' if t.ok else 'totals: ' + t.describe()}")
    return f"harvest run report: {name.name}", subtitle, sections


__all__ = ["launches_section", "run_page", "sessions_section"]
