"""The phase board and the run panel drawn from it, on a recorded console (no engine): phases in
order with their elapsed time, the progress bar and the status counts; lines printed through the
console while the panel is live land above its frame; off a terminal, one plain line per phase."""

from __future__ import annotations

import io
import re
import time

from rich.console import Console
from rich.live import Live

from harvest.campaign.outputs.phases import PhaseBoard
from harvest.campaign.outputs.progress import Progress, file_position
from harvest.events import Event


def test_a_sequential_phase_ends_the_one_before_and_ingest_runs_beside():
    board = PhaseBoard()
    t = time.monotonic()
    board.on_event(Event("ingest", "start", {"rows": 10_000, "size": 2 << 20}, at=t - 5))
    board.on_event(Event("preflight", "start", at=t - 4))
    board.on_event(Event("preflight", "end", {"passed": True, "rules": 7, "failures": 0}, at=t - 3.5))
    board.on_event(Event("launching", "start", {"engine": "vllm", "pid": 42}, at=t - 3))
    board.on_event(Event("launching", "update", {"line": "Loading weights took 0.1 s", "waiting_on": "GET /health"}))
    rows = {r.name: r for r in board.rows(now=t)}
    assert list(rows) == ["ingest", "preflight", "launching"]
    assert rows["ingest"].active and rows["launching"].active and not rows["preflight"].active
    assert abs(rows["launching"].elapsed_s - 3) < 1e-6 and abs(rows["preflight"].elapsed_s - 0.5) < 1e-6
    assert rows["preflight"].text.startswith("PASS (7 rules")
    assert "vllm pid 42, 3 s since spawn" in rows["launching"].text
    assert "Loading weights took 0.1 s" in rows["launching"].text and "waiting on GET /health" in rows["launching"].text
    board.on_event(Event("generating", "start", at=t))
    rows = {r.name: r for r in board.rows(now=t + 1)}
    assert not rows["launching"].active and rows["generating"].active and rows["ingest"].active
    assert abs(rows["launching"].elapsed_s - 3) < 1e-6  # frozen at its end


def test_stopping_shows_the_step_now_running_then_the_verdict():
    board = PhaseBoard()
    board.on_event(Event("stopping", "start"))
    board.on_event(Event("stopping", "update", {"step": "sigterm", "outcome": "sent to group 7"}))
    assert board.rows()[0].text == "step sigterm done: sent to group 7"
    board.on_event(Event("stopping", "update", {"step": "grace", "outcome": None}))
    assert board.rows()[0].text == "step grace ..."
    board.on_event(Event("stopping", "end", {"verdict": "clean", "seconds": 0.57}))
    assert board.rows()[0].text == "verified stop: CLEAN in 0.57 s" and board.rows()[0].ok


def _progress(tmp_path, console, **kw):
    data = tmp_path / "in.jsonl"
    data.write_text("x\n" * 1000)
    return Progress(tmp_path, total=300, already_final=0, console=console, data_path=str(data),
                    before={"done": 10, "skipped": 2}, **kw), data


def test_the_panel_has_phases_a_bar_and_coloured_counts(tmp_path):
    console = Console(file=io.StringIO(), width=130, force_terminal=True, record=True)
    progress, data = _progress(tmp_path, console, live=False)
    with open(data, "rb", buffering=0) as fh:
        fh.read(1000)  # the ingest has read the first 1000 of 2000 bytes
        assert file_position(str(data)) == 1000
        progress.ingest_began(time.monotonic() - 2, 500, ongoing=True)
        progress.begin("generating")
        for _ in range(30):
            progress.record("done", 10, 16)
        progress.record("truncated", 10, 16)
        progress.error("http_400")
        progress.record("failed")
        progress.server_endpoints = {"http://a:1": {"running": 3, "waiting": 1}, "http://b:2": {"running": 2,
                                                                                              "waiting": 0}}
        console.print(progress)
    text = console.export_text()
    lines = text.splitlines()
    frame = lines[lines.index(next(line for line in lines if line.startswith("╭"))):]
    body = "\n".join(frame)
    assert "ingest" in body and "500 rows read, 50% of 2.0 KB" in body
    assert "generating" in body
    assert "━" in body  # the bar
    assert "44 / 300" in body  # 12 final before + 32 this session
    assert "done 40" in body and "truncated 1" in body and "failed 1" in body and "skipped 2" in body
    assert "http://a:1  running 3   waiting 1" in body and "http://b:2  running 2   waiting 0" in body
    assert "http_400 1" in body
    rendered = Console(file=io.StringIO(), width=130, force_terminal=True, color_system="truecolor")
    rendered.print(progress)
    out = rendered.file.getvalue()  # type: ignore[attr-defined]
    assert "\x1b[32mdone" in out or "\x1b[32m" in out  # done in green
    assert "\x1b[31m" in out  # failed in red


def test_lines_printed_while_live_land_above_the_frame(tmp_path):
    console = Console(file=io.StringIO(), width=120, force_terminal=True, record=True)
    progress, _ = _progress(tmp_path, console)
    with Live(progress, console=console, auto_refresh=False) as live:
        progress.on_event(Event("preflight", "end", {"passed": True, "rules": 7, "failures": 0}))
        live.refresh()
        console.print("PASS  port           127.0.0.1:8000 is free")
        console.print("input: 300 rows, 300 unique")
        live.refresh()
    text = console.export_text()
    lines = text.splitlines()
    top = max(i for i, line in enumerate(lines) if line.startswith("╭"))
    assert any("127.0.0.1:8000 is free" in line for line in lines[:top])
    assert not any("is free" in line or "input:" in line for line in lines[top:])


def test_off_a_terminal_each_phase_change_is_one_plain_line(tmp_path):
    out = io.StringIO()
    console = Console(file=out, width=200)
    progress, _ = _progress(tmp_path, console, live=None)
    assert not console.is_terminal
    with progress:
        progress.on_event(Event("launching", "start", {"engine": "vllm", "pid": 7}))
        progress.on_event(Event("launching", "update", {"line": "Loading weights", "waiting_on": "GET /health"}))
        progress.on_event(Event("launching", "end", {"seconds": 3.2}))
        progress.update()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[harvest] launching (") and "vllm pid 7" in lines[0]
    assert "log: Loading weights" in lines[1] and "waiting on GET /health" in lines[1]
    assert "ready in 3.2 s" in lines[2]
    assert lines[3].startswith("[harvest] 12/300 items")  # the periodic line, as before
    assert "\x1b[" not in out.getvalue() and "╭" not in out.getvalue()


def test_a_sweeps_next_trial_starts_its_phases_afresh():
    board = PhaseBoard()
    board.on_event(Event("trial", "start", {"index": 1, "of": 3, "label": "reference"}))
    board.on_event(Event("launching", "start", {"engine": "vllm", "pid": 1}))
    board.on_event(Event("stopping", "start"))
    board.on_event(Event("stopping", "end", {"verdict": "clean", "seconds": 1.0}))
    board.on_event(Event("trial", "start", {"index": 2, "of": 3, "label": "kv_cache_dtype=fp8"}))
    board.on_event(Event("trial", "update", {"step": "probing quality and throughput"}))
    rows = board.rows()
    assert [r.name for r in rows] == ["trial"]
    assert rows[0].text == "trial 2 of 3 (kv_cache_dtype=fp8): probing quality and throughput"


def test_a_hung_endpoint_has_its_own_yellow_row(tmp_path):
    """The client's stats say an endpoint holds 4 requests with nothing back for 41 s (its bound:
    the 30 s floor): the panel gives it an ``endpoint`` row of its own, drawn yellow, and the line
    off a terminal names it the same way."""
    from harvest.client.endpoints import Endpoint
    from harvest.client.records import ClientStats

    url = "http://127.0.0.1:18123"
    hung = Endpoint(url)
    now = time.monotonic()
    for _ in range(4):
        hung.took(now - 41)
    console = Console(file=io.StringIO(), width=130, force_terminal=True, color_system="truecolor")
    progress, _ = _progress(tmp_path, console, live=False)
    progress.begin("generating")
    progress.in_flight = 8
    progress.client_stats = lambda: ClientStats(in_flight=4, held=0, completed=0, retries=0,
                                                endpoints=(hung.stats(time.monotonic()),))
    snap = progress.snapshot()
    (quiet,) = snap["no_answer"]
    assert quiet["url"] == url and quiet["outstanding"] == 4 and quiet["bound_s"] == 30.0 and quiet["quiet_s"] >= 41
    words = f"{url} no answer for {quiet['quiet_s']:.0f} s (4 requests in flight; shown past 30 s of nothing back)"
    assert words in progress.line(snap)
    lines = console.render_lines(progress.panel(snap, 130), console.options, pad=False)
    rows = [line for line in lines if "no answer for" in "".join(s.text for s in line)]
    assert len(rows) == 1, rows
    text = "".join(s.text for s in rows[0])
    assert re.match(r"│ endpoint +http://", text) and words in text, text
    figure = [s for s in rows[0] if s.text.strip() and s.text.strip() in words]
    assert figure and all(s.style is not None and s.style.color is not None and s.style.color.name == "yellow"
                          for s in figure), [(s.text, s.style) for s in rows[0]]
    label = next(s for s in rows[0] if s.text.strip() == "endpoint")
    assert label.style is None or label.style.color is None or label.style.color.name != "yellow"  # the label stays plain
