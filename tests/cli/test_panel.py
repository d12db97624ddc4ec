"""The run panel (``cli/panel.py``) drawn from a run's progress on a recorded console (no engine):
phases in order with their elapsed time, the progress bar and the status counts; lines printed
through the console while the panel is live land above its frame; off a terminal, one plain line
per phase change and one per progress.json write. The panel sees the run only as its events and
snapshots (a ``RunWatch``), and progress.json is the same document whoever watches."""

from __future__ import annotations

import io
import json
import re
import time

from rich.console import Console
from rich.live import Live

from harvest.campaign.outputs.progress import PROGRESS_FILE, Progress, ProgressView
from harvest.cli.panel import RunPanel, file_position, progress_line, run_panel
from harvest.cli.phases import PhaseBoard
from harvest.events import Event


def _progress(tmp_path, console, live):
    data = tmp_path / "in.jsonl"
    data.write_text("x\n" * 1000)
    panel = RunPanel(console, live=live)
    progress = Progress(tmp_path, total=300, already_final=0, data_path=str(data),
                        before={"done": 10, "skipped": 2}, watch=panel)
    return progress, panel, data


def test_the_panel_has_phases_a_bar_and_coloured_counts(tmp_path):
    console = Console(file=io.StringIO(), width=130, force_terminal=True, record=True)
    progress, panel, data = _progress(tmp_path, console, live=False)
    panel.opened(progress.view)
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
        console.print(panel)
    text = console.export_text()
    lines = text.splitlines()
    frame = lines[lines.index(next(line for line in lines if line.startswith("╭"))):]
    body = "\n".join(frame)
    assert f"harvest run: {tmp_path}" in body
    assert "ingest" in body and "500 rows read, 50% of 2.0 KB" in body
    assert "generating" in body
    assert "━" in body  # the bar
    assert "44 / 300" in body  # 12 final before + 32 this session
    assert "done 40" in body and "truncated 1" in body and "failed 1" in body and "skipped 2" in body
    assert "http://a:1  running 3   waiting 1" in body and "http://b:2  running 2   waiting 0" in body
    assert "http_400 1" in body
    rendered = Console(file=io.StringIO(), width=130, force_terminal=True, color_system="truecolor")
    rendered.print(panel)
    out = rendered.file.getvalue()  # type: ignore[attr-defined]
    assert "\x1b[32mdone" in out or "\x1b[32m" in out  # done in green
    assert "\x1b[31m" in out  # failed in red


def test_lines_printed_while_live_land_above_the_frame(tmp_path):
    console = Console(file=io.StringIO(), width=120, force_terminal=True, record=True)
    progress, panel, _ = _progress(tmp_path, console, live=False)
    panel.opened(progress.view)
    with Live(panel, console=console, auto_refresh=False) as live:
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
    assert any("PASS (7 rules)" in line for line in lines[top:])  # the event reached the panel's phases


def test_on_a_terminal_the_session_draws_a_live_panel_and_leaves_its_last_state(tmp_path):
    out = io.StringIO()
    console = Console(file=out, width=120, force_terminal=True)
    progress, panel, _ = _progress(tmp_path, console, live=None)
    assert console.is_terminal and panel.live_enabled
    with progress:
        progress.begin("generating")
        progress.record("done", 10, 16)
        progress.state = "finished"
        progress.update()
    drawn = out.getvalue()
    assert "╭" in drawn and "harvest run:" in drawn and "result" in drawn and "finished" in drawn
    assert "[harvest] " not in drawn  # no plain lines on a terminal


def test_off_a_terminal_each_phase_change_is_one_plain_line(tmp_path):
    out = io.StringIO()
    console = Console(file=out, width=200)
    progress, _, _ = _progress(tmp_path, console, live=None)
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
    assert len(lines) == 4
    assert "\x1b[" not in out.getvalue() and "╭" not in out.getvalue()


def test_progress_json_is_the_same_document_whoever_watches(tmp_path):
    """The watch changes what is shown, never what is written: progress.json of a run watched by
    the panel has the same keys and figures as one nobody watches (the phases running included)."""
    docs = []
    for name, watch in (("shown", RunPanel(Console(file=io.StringIO()), live=False)), ("unshown", None)):
        folder = tmp_path / name
        folder.mkdir()
        progress = Progress(folder, total=5, already_final=1, before={"done": 1}, watch=watch)
        with progress:
            progress.on_event(Event("ingest", "start", {"rows": 5}))
            progress.on_event(Event("launching", "start", {"engine": "vllm", "pid": 7}))
            progress.on_event(Event("generating", "start"))
            progress.record("done", 3, 4)
            progress.update()
        doc = json.loads((folder / PROGRESS_FILE).read_text())
        assert doc["phases"] == ["ingest", "generating"]  # launching ended as generating began
        doc["phase_states"] = [{k: v for k, v in p.items() if not k.endswith("_at")} for p in doc["phase_states"]]
        docs.append({k: v for k, v in doc.items() if k not in ("updated_at", "started_at", "eta_s")
                     and not k.endswith("_per_s")})  # times and rates: measured apart
    assert docs[0] == docs[1]


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
    progress, panel, _ = _progress(tmp_path, console, live=False)
    progress.begin("generating")
    progress.in_flight = 8
    progress.client_stats = lambda: ClientStats(in_flight=4, held=0, completed=0, retries=0,
                                                endpoints=(hung.stats(time.monotonic()),))
    view = progress.view()
    (quiet,) = view.snap["no_answer"]
    assert quiet["url"] == url and quiet["outstanding"] == 4 and quiet["bound_s"] == 30.0 and quiet["quiet_s"] >= 41
    words = f"{url} no answer for {quiet['quiet_s']:.0f} s (4 requests in flight; shown past 30 s of nothing back)"
    assert words in progress_line(view.snap)
    lines = console.render_lines(run_panel(view, panel.board, 130), console.options, pad=False)
    rows = [line for line in lines if "no answer for" in "".join(s.text for s in line)]
    assert len(rows) == 1, rows
    text = "".join(s.text for s in rows[0])
    assert re.match(r"│ endpoint +http://", text) and words in text, text
    figure = [s for s in rows[0] if s.text.strip() and s.text.strip() in words]
    assert figure and all(s.style is not None and s.style.color is not None and s.style.color.name == "yellow"
                          for s in figure), [(s.text, s.style) for s in rows[0]]
    label = next(s for s in rows[0] if s.text.strip() == "endpoint")
    assert label.style is None or label.style.color is None or label.style.color.name != "yellow"  # the label stays plain


def test_a_snapshot_read_back_from_progress_json_draws_the_same_panel(tmp_path):
    """The panel needs nothing of the run but its view: a snapshot read back from the file draws."""
    progress = Progress(tmp_path, total=10, already_final=0)
    progress.record("done", 1, 2)
    progress.note = "every endpoint stayed down past [client] health_deadline"
    progress.state = "server_down"
    progress.update()
    snap = json.loads((tmp_path / PROGRESS_FILE).read_text())
    console = Console(file=io.StringIO(), width=130, record=True)
    console.print(run_panel(ProgressView(tmp_path, snap), PhaseBoard(), 120))
    drawn = console.export_text()
    assert "1 / 10" in drawn and "server_down" in drawn
    assert "every endpoint stayed down past [client] health_deadline" in drawn


def test_the_level_and_why_it_is_there_have_their_own_row(tmp_path):
    """Under ``concurrency = "auto"`` the panel shows each endpoint's level and the reason for it
    ("engine capacity 1024 from /props", "probing: 512 paid x1.9"), so a bad decision can be seen;
    a fixed concurrency has no such row."""
    progress = Progress(tmp_path, total=10, already_final=0)
    progress.concurrency = {"http://a:1": 1024}
    progress.concurrency_reasons = {"http://a:1": "probing: 512 paid x1.90 over 256"}
    progress.update()
    snap = json.loads((tmp_path / PROGRESS_FILE).read_text())
    console = Console(file=io.StringIO(), width=130, record=True)
    console.print(run_panel(ProgressView(tmp_path, snap), PhaseBoard(), 120))
    drawn = console.export_text()
    assert re.search(r"level\s+1024: probing: 512 paid x1\.90 over 256", drawn), drawn
    assert "(auto target 1024)" in drawn
    progress.concurrency = {"http://a:1": 1024, "http://b:2?api_key=SECRET": 3}
    progress.concurrency_reasons = {"http://a:1": "nothing published (/server_info, /props, /metrics): starting high",
                                    "http://b:2?api_key=SECRET": "engine capacity 3 from /props"}
    console = Console(file=io.StringIO(), width=130, record=True)
    console.print(run_panel(progress.view(), PhaseBoard(), 120))
    drawn = console.export_text()
    assert "http://a:1  1024: nothing published (/server_info, /props, /metrics): starting high" in drawn
    assert "3: engine capacity 3 from /props" in drawn and "SECRET" not in drawn, drawn
    fixed = Progress(tmp_path / "f", total=10, already_final=0)
    console = Console(file=io.StringIO(), width=130, record=True)
    console.print(run_panel(fixed.view(), PhaseBoard(), 120))
    assert "│ level" not in console.export_text()
