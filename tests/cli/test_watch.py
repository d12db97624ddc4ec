"""``harvest run --detach`` and ``harvest status RUN_DIR --watch`` on the suite's own loopback endpoint
(what is under test is harvest's side; the real engine, the terminal and the shell's hangup are in
tests/campaign/test_days.py):

- a configuration mistake comes back to the terminal with exit 2, nothing started;
- the starter returns once the run passed its start checks, the run going on detached; a second
  ``--detach`` of the same folder is refused while it runs;
- ``status --watch`` of the run going on ends when it ends, with exit 0 (finished); of a run that is
  not running it says so, shows the last state and exits as that session ended (1: stopped).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harvest.campaign.run import runner
from harvest.cli.watch import board_of
from harvest.config import parse_config
from tests import harvest_process
from tests.campaign.loopback import Endpoint
from tests.placed import run_campaign

HARVEST = [sys.executable, "-m", "harvest"]
N = 80


def write_job(tmp_path: Path, url: str, **run: object) -> Path:
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"id": f"w{i}", "prompt": f"Watch {i}."}) + "\n"
                                               for i in range(N)))
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in run.items())
    job = tmp_path / "job.toml"
    job.write_text(f'[data]\npath = "in.jsonl"\nid_field = "id"\n[sampling]\nmax_tokens = 8\n'
                   f'[client]\nendpoints = ["{url}"]\nconcurrency = 4\n[run]\nprogress_interval = 0.2\n{extra}'
                   f'[output]\ndir = "run"\n')
    return job


def harvest(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return harvest_process.run([*HARVEST, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                               env={**os.environ, "COLUMNS": "130"})


def test_a_config_mistake_of_a_detached_run_comes_back_with_exit_2(tmp_path):
    job = write_job(tmp_path, "http://127.0.0.1:9", max_relaunchez=1)
    out = harvest("run", str(job), "--detach", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert "max_relaunchez" in out.stderr and not (tmp_path / "run" / runner.RUNNER_FILE).exists()


@pytest.mark.slow  # three harvest processes and a detached run: about 7 s
def test_detached_run_watched_to_its_end_then_watched_again_when_not_running(tmp_path):
    run_dir = tmp_path / "run"
    record = None
    with Endpoint() as ep:
        try:
            ep.hold_after(20)  # the run goes on, held, until the test lets it finish
            job = write_job(tmp_path, ep.url)
            started = harvest("run", str(job), "--detach", cwd=tmp_path)
            record = runner.read(run_dir)
            assert started.returncode == 0, started.stdout + started.stderr
            assert f"harvest status {run_dir} --watch" in started.stdout, started.stdout
            assert f"harvest stop {run_dir}" in started.stdout
            assert record is not None and record.detached and runner.alive(record) and record.ended_at is None
            again = harvest("run", str(job), "--detach", cwd=tmp_path)
            assert again.returncode == 2 and f"running already (pid {record.pid})" in again.stderr, again.stderr
            watch = harvest_process.popen([*HARVEST, "status", "run", "--watch"], cwd=tmp_path, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "130"})
            assert watch.stdout is not None
            assert select.select([watch.stdout], [], [], 60)[0], "the watch said nothing in 60 s"
            first = watch.stdout.readline()  # attached while the run is held (its first line said so)
            assert f"watching the run in run (runner pid {record.pid})" in first, first
            ep.release()
            rest, _ = watch.communicate(timeout=120)
            out = first + rest
        finally:
            ep.release()
            if record is not None and runner.alive(record):  # the runner this test started, by its record
                runner.stop(record, deadline_s=30)
    assert watch.returncode == 0, out
    assert f"runner pid {record.pid}" in out and "finished, exit code 0" in out, out
    ended = runner.read(tmp_path / "run")
    assert ended is not None and ended.exit_code == 0 and not runner.alive(record)
    assert "=== harvest run --detach" in (tmp_path / "run" / runner.RUN_LOG).read_text()
    later = harvest("status", "run", "--watch", cwd=tmp_path)
    assert later.returncode == 0 and "is not running" in later.stdout + later.stderr


async def test_watch_of_a_stopped_run_says_so_shows_its_last_state_and_exits_1(tmp_path):
    with Endpoint(mode="bad_request") as ep:
        config = parse_config({"data": {"path": str(write_job(tmp_path, ep.url).parent / "in.jsonl"), "id_field": "id"},
                               "client": {"endpoints": [ep.url], "concurrency": 4},
                               "run": {"breaker_window": 5}, "output": {"dir": str(tmp_path / "run")}})
        report = await run_campaign(config)
    assert report.outcome == "stopped"
    out = harvest("status", str(tmp_path / "run"), "--watch", cwd=tmp_path)
    text = " ".join((out.stdout + out.stderr).replace("│", " ").split())
    assert out.returncode == 1, text
    assert "is not running; its last session" in text and "stopped" in text and "exit code 1" in text, text
    assert "result stopped" in text and "items" in text  # the panel's last state


def test_the_phase_rows_come_back_from_progress_json():
    now = time.time()
    board = board_of([{"name": "launching", "started_at": now - 30, "ended_at": now - 20, "ok": True,
                       "info": {"engine": "vllm", "pid": 42, "seconds": 10.0}},
                      {"name": "generating", "started_at": now - 20, "ended_at": None, "ok": True, "info": {}}])
    rows = {r.name: r for r in board.rows()}
    assert rows["launching"].text == "vllm pid 42 ready in 10.0 s" and not rows["launching"].active
    assert rows["generating"].active and 19 < rows["generating"].elapsed_s < 25
