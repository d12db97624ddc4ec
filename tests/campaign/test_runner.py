"""runner.json and the stop of a runner (campaign/run/runner.py): the record read back, liveness
measured by pid and create time (a reused pid is not the runner), SIGTERM first and SIGKILL only
past the deadline, each verified on a real child process the test started."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace

import psutil

from harvest import safefiles
from harvest.campaign.run import runner

#: A runner that ends on SIGTERM (as harvest run does, once its items are released), and one that does not.
POLITE = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); "
          "print('up', flush=True); time.sleep(60)")
DEAF = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"


def _child(code: str) -> tuple[subprocess.Popen[str], runner.RunnerRecord]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"  # its handler is set
    record = runner.RunnerRecord(proc.pid, psutil.Process(proc.pid).create_time(), time.time(), stop_s=5.0)
    return proc, record


def test_the_record_reads_back_and_a_reused_pid_is_not_the_runner(tmp_path):
    mine = runner.RunnerRecord.mine(detached=True, log=runner.RUN_LOG, stop_s=90, argv=("harvest", "run", "j.toml"))
    with safefiles.hold(tmp_path, create=True) as folder:
        runner.write(folder, mine)
        assert runner.read(folder) == mine == runner.read(tmp_path)
        runner.write(folder, mine.ended("interrupted", 130, "stopped"))
    back = runner.read(tmp_path)
    assert back is not None and back.exit_code == 130 and back.outcome == "interrupted" and back.ended_at
    assert runner.alive(mine)
    assert not runner.alive(replace(mine, create_time=mine.create_time - 100))  # same pid, another process
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / runner.RUNNER_FILE).write_text('{"schema": "harvest.status/1", "pid": 1}')
    assert runner.read(tmp_path / "other") is None


def test_a_runner_is_asked_with_sigterm_and_killed_only_past_its_deadline():
    proc, record = _child(POLITE)
    done = runner.stop(record, deadline_s=10)
    assert done.asked and not done.killed and done.gone and done.exited_after_s is not None
    assert proc.wait(5) == 0  # it ended by itself, on SIGTERM
    proc, record = _child(DEAF)
    done = runner.stop(record, deadline_s=0.5)
    assert done.asked and done.killed and done.gone and done.exited_after_s is None
    assert proc.wait(5) == -9
    assert not runner.stop(record).asked  # gone already: nothing sent
