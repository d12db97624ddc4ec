"""The live panel fits the terminal a person has: at 80 x 30 and at 130 x 40, with a sick endpoint
beside a healthy one, no label is cut and every figure of the panel is on screen (long values
wrap). A hung endpoint (it accepts requests and never answers) is named within its bound, on the
--no-live line and in `harvest status`.

The endpoints are real HTTP servers: bench/sim_engine.py (healthy, slow enough to watch), a server
whose completions and /health answer 503 (sick) and one that holds every completion open (hung);
tests/cli/endpoints.py. The terminal is tmux.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import harvest_process
from tests.cli.endpoints import misbehaving
from tests.cli.terminal import Screen, Terminal
from tests.cli.test_live_terminal import _exited, _start_sim, _stop_sim, assert_clean_frames

pytestmark = pytest.mark.engine

HARVEST = [sys.executable, "-m", "harvest"]
#: The panel's labels, as they must read (whole) at the start of a row.
LABELS = ("items", "rate", "load", "endpoint", "ETA")
#: What the panel must show with a sick endpoint: every figure of its rows, the server's own
#: running and waiting requests included (the simulated engine serves /metrics).
FIGURES = ("items/s", "gen", "prompt", "tok/s", "sent", "done", "truncated", "failed", "skipped",
           "sick, not answering", "s waited of the 600 s health_deadline", "running", "waiting")


#: [client] hang_floor of the hung-endpoint test: the stand-in never answers, so the bound is the
#: floor (30 s by default; the arithmetic does not depend on it).
HANG_FLOOR = 5.0


def write_job(folder: Path, base_url: str, more: list[str], n: int, hang_floor: float | None = None) -> None:
    (folder / "prompts.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"Topic {i}."}) + "\n"
                                                  for i in range(n)))
    (folder / "job.toml").write_text(f"""
[server]
engine = "openai"
base_url = "{base_url}"
model = "sim-model"

[data]
path = "prompts.jsonl"

[sampling]
max_tokens = 6

[client]
concurrency = 4
endpoints = {json.dumps(more)}
{"" if hang_floor is None else f"hang_floor = {hang_floor}"}

[run]
progress_interval = 0.5

[output]
dir = "run"
""")


def label_of(line: str) -> str | None:
    """The label a panel row starts with (``│ items    ━━━`` -> ``items``), None for a wrapped row."""
    m = re.match(r"│ (\S+)", line)
    return m.group(1) if m else None


@pytest.mark.parametrize("size", [(80, 30), (130, 40)], ids=["80x30", "130x40"])
def test_the_panel_fits_with_a_sick_endpoint(tmp_path, size):
    width, height = size
    sim, url = _start_sim(tmp_path)
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}
    try:
        with misbehaving("sick") as sick:
            write_job(tmp_path, url, [sick], n=160)
            term = Terminal(tmp_path / "screens", width=width, height=height)
            try:
                term.start([*HARVEST, "run", "job.toml"], env=env, cwd=tmp_path)
                status = _exited(term, time.monotonic() + 240)
                assert status == 0, term.screens[-1].text
            finally:
                term.stop()
    finally:
        _stop_sim(sim)

    assert_clean_frames(term.screens)
    framed = [s for s in term.screens if s.frames()]
    for screen in framed:
        inside = screen.inside()
        assert not any("…" in line for line in inside), f"a cut value at {width} columns:\n{screen.text}"
        for line in inside:
            assert len(line) <= width, line
            # A row starts with a phase's mark, a whole label, or spaces (a value wrapped onto the
            # next row, or the status counts under the bar).
            label = label_of(line)
            assert label is None or label in (*LABELS, "cache", "errors", "result", "note", "✓", "▶", "✗"), \
                f"{label!r} is not a whole label at {width} columns:\n{screen.text}"
    with_sick = [s for s in framed if any(label_of(line) == "endpoint" for line in s.inside())]
    assert with_sick, f"no screen showed the sick endpoint's row at {width} columns:\n{framed[-1].text}"
    # The healthy endpoint's gauges as numbers, on its own row (two endpoints: one row each).
    gauges = re.compile(rf"{re.escape(url)} running \d+ waiting \d+")
    for screen in with_sick:
        text = " ".join(" ".join(line.strip("│ ").split()) for line in screen.inside())
        missing = [f for f in FIGURES if f not in text]
        if not missing and gauges.search(text) and all(any(label_of(line) == lab for line in screen.inside())
                                                       for lab in LABELS):
            break
    else:
        screen = with_sick[-1]
        raise AssertionError(f"no screen at {width} columns showed every label {LABELS}, figure {FIGURES} and "
                             f"{url}'s running / waiting; the last one:\n{screen.text}")


def test_a_hung_endpoint_is_named_within_its_bound(tmp_path):
    """The only endpoint accepts every completion and never answers: no error ever comes (the
    request timeout is 600 s), so nothing else would say why nothing moves. Within ``hang_floor``
    (no answer yet to take a p90 from; HANG_FLOOR here, the stand-in answers nothing at all) plus a
    few progress intervals the --no-live line and `harvest status` name it, with the time waited."""
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}
    with misbehaving("hung") as hung:
        write_job(tmp_path, hung, [], n=8, hang_floor=HANG_FLOOR)
        started = time.monotonic()
        proc = harvest_process.popen([*HARVEST, "run", "job.toml", "--no-live"], cwd=tmp_path, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            seen: dict | None = None
            bound = started + HANG_FLOOR + 20
            while time.monotonic() < bound:
                out = harvest_process.run([*HARVEST, "status", "run", "--json"], cwd=tmp_path, env=env,
                                          capture_output=True, text=True, timeout=60, check=False)
                doc = json.loads(out.stdout) if out.returncode == 0 and out.stdout.strip() else {}
                quiet = ((doc.get("progress") or {}).get("no_answer")) or []
                if quiet:
                    seen = quiet[0]
                    break
                time.sleep(1)
            assert seen is not None, f"no endpoint was named as not answering within {HANG_FLOOR + 20:.0f} s"
            assert seen["url"] == hung and seen["outstanding"] == 4 and seen["bound_s"] == HANG_FLOOR
            assert HANG_FLOOR < seen["quiet_s"] <= time.monotonic() - started
            table = harvest_process.run([*HARVEST, "status", "run"], cwd=tmp_path, env=env, capture_output=True,
                                        text=True, timeout=60, check=False)
            assert re.search(rf"endpoint {re.escape(hung)} no answer for \d+ s \(4 requests in flight", table.stdout), \
                table.stdout
        finally:
            os.killpg(proc.pid, signal.SIGINT)  # the run this test started, by its group
            try:
                stdout, stderr = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                stdout, stderr = proc.communicate(timeout=30)
    lines = [line for line in (stdout + stderr).splitlines() if "no answer for" in line]
    # the progress line names it (the log line of the hang, "endpoint URL hung: no answer ...", too)
    assert any(f"{hung} no answer for" in line for line in lines), stdout + stderr
    assert proc.returncode == 130, stderr


def test_ctrl_c_at_80_columns_leaves_one_panel_and_whole_words_around_it(tmp_path):
    # Before: the terminal echoed ^C under the panel, which then left a second top border behind;
    # the lines above and below it (the context line, the totals, what to run) were cut mid-word.
    sim, url = _start_sim(tmp_path)
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}
    try:
        write_job(tmp_path, url, [], n=400)
        term = Terminal(tmp_path / "screens", width=80, height=30)
        try:
            term.start([*HARVEST, "run", "job.toml"], env=env, cwd=tmp_path)

            def some_done(s: Screen) -> bool:
                m = re.search(r"━.*?(\d+) / \d+", s.text)
                return m is not None and int(m.group(1)) >= 8

            deadline = time.monotonic() + 120
            while not some_done(term.capture()):
                assert time.monotonic() < deadline and term.exit_status() is None, term.screens[-1].text
                time.sleep(0.25)
            term.send("C-c")
            assert _exited(term, time.monotonic() + 60) == 130, term.screens[-1].text
        finally:
            term.stop()
    finally:
        _stop_sim(sim)
    last = term.screens[-1]
    assert [line for line in last.lines if line.startswith("╭")] == [last.lines[last.frames()[0][0]]], last.text
    outside = last.above() + last.lines[last.frames()[-1][1] + 1:]
    # the screen is captured with wrapped lines joined: a longer line is one the terminal cut (a
    # label and one path, or a command to copy, have no space to break at: kept whole)
    cut = [line for line in outside if len(line) > 80 and "`harvest run" not in line and len(line.split()) > 2]
    assert cut == [], last.text
    said = " ".join(outside)
    assert "context: unknown" in said and re.search(r"^CHECK ", last.text, re.M), last.text
    assert "run `harvest run job.toml` again to resume" in said, last.text
