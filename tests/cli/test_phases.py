"""The phase rows of every live display (``cli/phases.py``): phases in order with their elapsed time
and a line of words each; off a terminal one filter says which events print a line, the same for
``harvest run``'s panel and ``harvest serve``/``stop``/``tune``'s."""

from __future__ import annotations

import io
import re
import time

from rich.console import Console

from harvest.campaign.outputs.progress import Progress
from harvest.cli.live import PhaseDisplay
from harvest.cli.panel import RunPanel
from harvest.cli.phases import PhaseBoard, phase_line
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


def _events() -> list[Event]:
    return [Event("ingest", "start", {"rows": 10}), Event("ingest", "update", {"rows": 20}),
            Event("launching", "start", {"engine": "llamacpp", "pid": 9}),
            Event("launching", "update", {"waiting_on": "GET /health"}),
            Event("connecting", "update", {"url": "http://127.0.0.1:1", "waited_s": 1}),
            Event("launching", "end", {"seconds": 1.5}), Event("stopping", "start"),
            Event("stopping", "update", {"step": "sigterm", "outcome": None}),
            Event("stopping", "end", {"verdict": "clean", "seconds": 0.2})]


def _shown(lines: str) -> list[str]:
    """The lines with their figures as N (elapsed seconds differ by when each display drew them)."""
    return [re.sub(r"\d+(\.\d+)?", "N", line) for line in lines.splitlines()]


def test_off_a_terminal_the_run_panel_and_the_phase_panel_print_the_same_lines(tmp_path):
    """A phase start or end is one line; a launch's update is one (what it waits on, its log); no
    other update prints. ``harvest run``'s panel and the phase panel of serve, stop and tune print
    the same lines for the same events: one filter (``phase_line``)."""
    events = _events()
    board, expected = PhaseBoard(), []
    for event in events:
        board.on_event(event)
        if (line := phase_line(board, event)) is not None:
            expected.append(line)
    assert [line.split(" ", 2)[1] for line in expected] == ["ingest", "launching", "launching", "launching",
                                                           "stopping", "stopping"]
    run_out, phase_out = io.StringIO(), io.StringIO()
    progress = Progress(tmp_path, total=1, already_final=0, watch=RunPanel(Console(file=run_out, width=200)))
    with PhaseDisplay(Console(file=phase_out, width=200), "harvest serve") as display, progress:
        for event in events:
            progress.on_event(event)
            display.on_event(event)
    assert _shown(run_out.getvalue()) == _shown(phase_out.getvalue()) == _shown("\n".join(expected))


def test_off_a_terminal_an_endpoint_that_does_not_answer_is_said_at_once_then_every_10_s():
    # `--no-live` against an endpoint refusing connections: before, nothing for the whole 60 s
    board = PhaseBoard()
    lines = []
    for event in [Event("connecting", "start", {"deadline_s": 60, "endpoints": 1}),
                  *[Event("connecting", "update", {"url": "http://127.0.0.1:9", "waited_s": w,
                                                   "got": "refused the connection"})
                    for w in (0.02, 1.03, 2.05, 9.6, 10.4, 11.4, 20.3, 21.3)]]:
        board.on_event(event)
        lines.append(phase_line(board, event))
    shown = [line for line in lines if line is not None]
    assert len(shown) == 4, shown  # the start, the first try, then at 10 s and at 20 s
    assert shown[1].startswith("[harvest] connecting (") and shown[1].endswith(
        "asking /v1/models of http://127.0.0.1:9: refused the connection, 0 s of the 60 s start_deadline"), shown
    assert shown[2].endswith("10 s of the 60 s start_deadline") and shown[3].endswith("20 s of the 60 s start_deadline")
