"""Strings another user wrote reach root's terminal and pages inert.

``harvest status``, ``export`` and ``report`` may read another user's run; ``harvest ps`` lists the
launch records harvest's index names; ``harvest stop`` names the processes it finds. What they show
(ids, error classes, error messages, the runner's recorded state, the job's meta, a launch
record's fields, another user's process name) is the other user's text: an ESC ] 52 sequence
writes root's clipboard, ESC [ 2J clears the screen, a BEL rings. Each is shown escaped
(``\\x1b]52;...``), on the console and in the page, never as the byte.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harvest.campaign.outputs.timeline import TIMELINE_SCHEMA
from harvest.dataset import Item, Message, Skipped
from harvest.ledger import Completion, Ledger
from harvest.server.state import LaunchRecord, RunState, RunStatus, StateFile, register_run
from tests import engines
from tests.security.test_planted import (AS_NOBODY, _alive, _end_sleeper, _record, as_nobody, harvest,  # noqa: F401
                                         shared_tmp)

OSC52 = "\x1b]52;c;ZWNobyBvd25lZA==\x07"  # "set the clipboard" (here to "echo owned")
CLEAR = "\x1b[2J\x1b[H"
CONTROLS = ("\x1b", "\x07", "\x9b")


@pytest.fixture
def env(tmp_path):
    return {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}


def assert_inert(*texts: str | bytes) -> None:
    for text in texts:
        raw = text if isinstance(text, bytes) else text.encode("utf-8", "surrogateescape")
        assert b"\x1b" not in raw and b"\x07" not in raw and b"\xc2\x9b" not in raw, raw[-2000:]


def crafted_run(stage: Path) -> None:
    """A run folder as another user could write it: ids, error classes, messages, the job meta,
    progress.json and timeline.json all carrying terminal controls."""
    evil_id = f"id{OSC52}{CLEAR}\x9b31m"
    items: list[Item | Skipped] = [Item(evil_id, "in.jsonl", 1, (Message("user", "a"),), evil_id),
                                   Item("ok", "in.jsonl", 2, (Message("user", "b"),), "ok"),
                                   Skipped(f"in{CLEAR}.jsonl", 3, f"bad JSON{OSC52}")]
    meta = {"job": {"server": {"engine": "openai", "base_url": f"http://h{CLEAR}:1/v1"},
                    "data": {"path": f"in{OSC52}.jsonl"}, "client": {"endpoints": [f"http://e{CLEAR}:2"]}},
            "job_file": f"job{OSC52}.toml"}
    with Ledger.open(stage, settings_hash=f"h{CLEAR}", meta=meta) as ledger:
        ledger.ingest(items)
        ledger.claim(10)
        ledger.complete([Completion("ok", {"messages": [{"role": "assistant", "content": "x"}]},
                                    finish_reason="stop", prompt_tokens=1, completion_tokens=1)])
        assert ledger.fail(evil_id, f"HTTP 400: bad{OSC52}{CLEAR}\x07 prompt", f"http_400{CLEAR}\x07")
    (stage / "progress.json").write_text(json.dumps({
        "pid": 999999, "started_at": time.time() - 60, "updated_at": time.time(), "state": f"finished{CLEAR}",
        "note": f"note{OSC52}", "errors_by_class": {f"c{CLEAR}": 1}}))
    (stage / "timeline.json").write_text(json.dumps({
        "schema": TIMELINE_SCHEMA, "stride": 1, "max_points": 10, "sessions": [], "intervals": [],
        "launches": [{"session": 1, "launched_at": time.time() - 50, "engine": f"eng{OSC52}",
                      "engine_version": f"v{CLEAR}", "pid": 1, "gpus": [], "baseline_mib": {}, "ready_s": 1.0,
                      "kv_capacity_tokens": None, "stop": None}]}))


def test_status_report_and_export_of_a_crafted_run_show_its_controls_escaped(tmp_path, shared_tmp, env):
    stage = shared_tmp / "stage"
    stage.mkdir()
    crafted_run(stage)
    for p in stage.iterdir():
        p.chmod(0o644)
    stage.chmod(0o755)
    evil = shared_tmp / "evilrun"
    as_nobody(f"mkdir -m 755 {evil} && cp {stage}/ledger.sqlite {stage}/progress.json {stage}/timeline.json {evil}/")
    assert (evil / "ledger.sqlite").stat().st_uid != 0
    page = tmp_path / "report.html"
    outputs = [harvest(env, "status", str(evil)), harvest(env, "status", str(evil), "--errors", "5"),
               harvest(env, "report", str(evil), "--output", str(page)),
               harvest(env, "export", str(evil), "--format", "sharegpt", "--status", "done,failed",
                       "--output", str(tmp_path / "out.jsonl"))]
    assert [o.returncode for o in outputs[:3]] == [0, 0, 0], [(o.args[3:], o.stdout, o.stderr) for o in outputs]
    for done in outputs:
        assert_inert(done.stdout, done.stderr)
    status = outputs[0].stdout
    assert "\\x1b]52;c;ZWNobyBvd25lZA==\\x07" in status and "\\x1b[2J" in status, status  # shown, escaped
    assert "http_400\\x1b[2J" in status, status
    html = page.read_bytes()
    assert_inert(html)
    assert b"\\x1b]52;c;ZWNobyBvd25lZA==\\x07" in html and b"http_400\\x1b[2J" in html


def test_ps_shows_the_fields_of_a_launch_record_escaped(tmp_path, env, monkeypatch):
    """A run folder named with controls (a name another user chose for a folder in a shared place)
    and a record whose fields carry them: ``ps`` prints them escaped."""
    run_dir = tmp_path / f"served{OSC52}{CLEAR}"
    run_dir.mkdir(mode=0o700)
    record = LaunchRecord(engine=f"command{CLEAR}", pid=999999, pgid=999999, create_time=0.0,
                          argv=("srv", f"--x{OSC52}"), host="127.0.0.1", port=1, url=f"http://127.0.0.1:1{CLEAR}",
                          gpus=(), baseline_mib={}, engine_version=f"v{OSC52}", started_at=time.time(),
                          log_path=str(run_dir / "server.log"), stop_grace=1.0, stop_deadline=2.0)
    monkeypatch.setenv("HARVEST_STATE_DIR", env["HARVEST_STATE_DIR"])
    StateFile(run_dir).write(RunState(record=record, status=RunStatus.STOPPED))
    register_run(run_dir, f"command{CLEAR}", 1)
    outputs = [harvest(env, "ps", "--all"), harvest(env, "ps", "--all", "--json")]
    assert all(o.returncode == 0 for o in outputs), [(o.stdout, o.stderr) for o in outputs]
    for done in outputs:
        assert_inert(done.stdout, done.stderr)
    assert "served\\x1b]52;c;ZWNobyBvd25lZA==\\x07" in outputs[0].stdout, outputs[0].stdout
    assert "command\\x1b[2J" in outputs[0].stdout, outputs[0].stdout


def test_stop_names_another_users_process_with_its_controls_escaped(tmp_path, env):
    """A stale record names group X; X now holds a process of ``nobody`` whose name (its comm,
    what ``ps`` shows) is an escape sequence. ``harvest stop`` signals nothing and names it, escaped."""
    code = ("import ctypes, os, time\nos.setsid()\npid = os.fork()\nif pid == 0:\n"
            "    null = os.open(os.devnull, os.O_RDWR)\n"
            "    for fd in (0, 1, 2):\n        os.dup2(null, fd)\n"
            "    ctypes.CDLL(None).prctl(15, b'\\x1b]52;c;eA==\\x07', 0, 0, 0)\n"
            "    time.sleep(300)\n    os._exit(0)\nprint(os.getpid(), pid, flush=True)\n")
    done = subprocess.run([*AS_NOBODY, sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd="/")
    assert done.returncode == 0, done.stderr
    group, member = map(int, done.stdout.split())
    end = time.monotonic() + 10
    while psutil.Process(member).name() != "\x1b]52;c;eA==\x07" and time.monotonic() < end:
        time.sleep(0.05)
    member_ct = psutil.Process(member).create_time()
    try:
        stale = tmp_path / "stale"
        stale.mkdir(mode=0o700)
        (stale / "launch.json").write_text(json.dumps(_record(group, member_ct - 30.0, stale, engines.free_port())))
        os.chmod(stale / "launch.json", 0o600)
        stop = harvest(env, "stop", str(stale))
        assert _alive(member, member_ct), stop.stdout + stop.stderr
        assert_inert(stop.stdout, stop.stderr)
        assert f"{member} (\\x1b]52;c;eA==\\x07)" in stop.stdout + stop.stderr, stop.stdout + stop.stderr
    finally:
        _end_sleeper(member, member_ct)
