"""A campaign that runs for days, on a real llama-server harvest launches (the tiny model):

- started with ``harvest run --detach`` from a shell: the command returns once the run passed its
  start checks (the run still going, items pending); the shell that started it is closed (SIGHUP
  to its session) and the run goes on; ``harvest status --watch`` attached mid-run in a real
  terminal (tmux) shows the run's panel and ends with the run's exit code;
- ``harvest stop RUN_DIR`` (the documented command) stops it as Ctrl-C does: nothing left running
  in the ledger, every item not done pending with no attempt charged, the engine's verified stop
  clean (its group gone); the same ``harvest run --detach`` again resumes it to the end, every item
  exactly once;
- the what-happened record: the report lists both sessions and how each ended, and both launches
  with their pids and a link to each one's log (the first launch's log kept).

The tiny model answers a hundred items a second, faster than a terminal attaches: the llama-server
runs behind tests/hang_engine.py, which holds every completion after ``HOLD_AFTER`` answers of the
first launch (``/health`` answering), so the run is still going, its requests in flight, however
fast the machine, while the test watches and stops it; the second launch answers everything
(``--first-launch``: also when the test stopped the run before the hold began). The
hang check's default bound (30 s of quiet) is never reached: the hold lasts a few seconds.
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

from harvest.campaign.run import runner
from tests import engines, harvest_process
from tests.campaign.ledger_peek import attempts, statuses
from tests.campaign.test_give_up import group_gone
from tests.campaign.test_hang import HANG_ENGINE, ids_once
from tests.cli.terminal import Terminal

pytestmark = [pytest.mark.engine, pytest.mark.slow]

HARVEST = [sys.executable, "-m", "harvest"]
N = 300
#: Completions the first launch answers before it holds every further one (see above).
HOLD_AFTER = 100


def write_job(tmp_path: Path, llama_server_bin: str, tiny_gguf: Path) -> Path:
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"id": f"d{i}", "prompt": f"Write about day {i}."})
                                               + "\n" for i in range(N)))
    job = tmp_path / "job.toml"
    command = [sys.executable, str(HANG_ENGINE), "--hang-after", str(HOLD_AFTER), "--first-launch",
               str(tmp_path / "first-launch"), "--", llama_server_bin]
    job.write_text(f"""
[server]
engine = "llamacpp"
model = {json.dumps(str(tiny_gguf))}
command = {json.dumps(command)}
port = {engines.free_port()}
extra_args = ["-c", "4096"]
stop_grace = 5
stop_deadline = 30

[preflight]
min_disk_free_gib = 0.05
ram_reserve_gib = 0

[data]
path = "in.jsonl"
id_field = "id"

[sampling]
max_tokens = 48

[client]
concurrency = 2

[run]
progress_interval = 0.5

[output]
dir = "run"
""")
    return job


def start_from_a_shell(tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """A shell in a session of its own runs ``harvest run --detach`` and stays open; returns it and
    what the command printed once it returned."""
    shell = subprocess.Popen(["bash", "-c", f"{' '.join(HARVEST)} run job.toml --detach 2>&1; echo \"rc=$?\"; "
                                            "exec sleep 300"],
                             cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert shell.stdout is not None
    lines = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = shell.stdout.readline()  # bounded: the starter's own bound is within the test's timeout
        lines.append(line)
        if line.startswith("rc=") or not line:
            break
    return shell, "".join(lines)


def hang_up(shell: subprocess.Popen[str]) -> None:
    """The terminal of the shell closes: SIGHUP to its session's group (the shell the test started)."""
    os.killpg(shell.pid, signal.SIGHUP)
    shell.wait(timeout=10)
    assert shell.returncode == -signal.SIGHUP


def watch_in_terminal(term: Terminal, tmp_path: Path, env: dict[str, str], until: float,
                      drawn: bool = False) -> int | None:
    term.start([*HARVEST, "status", "run", "--watch"], env=env, cwd=tmp_path)
    return follow(term, until, drawn)


def follow(term: Terminal, until: float, drawn: bool = False) -> int | None:
    """Capture the screen until the command in it exits (its status), ``until`` passes or, with
    ``drawn``, its panel has been drawn twice (None)."""
    while time.monotonic() < until:
        term.capture()
        status = term.exit_status()
        if status is not None or (drawn and len(panels(term)) >= 2):
            return status
        time.sleep(0.25)
    return None


def panels(term: Terminal) -> list[int]:
    """The items done, as each screen's panel shows them (the bar's ``N / 300``)."""
    out = []
    for s in term.screens:
        m = next((re.search(rf"━.*?(\d[\d,]*) / {N}", line) for line in s.inside() if f" / {N}" in line), None)
        if m:
            out.append(int(m.group(1).replace(",", "")))
    return out


def test_detached_run_survives_its_shell_is_watched_stopped_and_resumed_to_the_end(tmp_path, llama_server_bin,
                                                                                   tiny_gguf):
    write_job(tmp_path, llama_server_bin, tiny_gguf)
    run_dir = tmp_path / "run"
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}
    first = second = None
    term = Terminal(tmp_path / "watch-1")
    try:
        shell, said = start_from_a_shell(tmp_path, env)
        first = runner.read(run_dir)
        assert "rc=0" in said and "harvest run: started; runs on detached" in said, said
        assert first is not None and first.detached and runner.alive(first)
        assert statuses(run_dir).get("pending", 0) > 0, "the command returned only at the run's end"
        assert f"harvest status {run_dir} --watch" in said and f"harvest stop {run_dir}" in said
        hang_up(shell)  # the shell that started it is gone; the run is not
        time.sleep(0.5)
        assert runner.alive(first), "the hangup of the starting shell reached the run"

        # attached mid-run in a real terminal: the panel, live, until the run stops
        status = watch_in_terminal(term, tmp_path, env, time.monotonic() + 60, drawn=True)
        assert status is None, term.screens[-1].text
        seen = panels(term)
        assert len(seen) >= 2 and seen[-1] <= HOLD_AFTER + 2, seen  # the panel of the run going on
        engine = json.loads((run_dir / "server" / "launch.json").read_text())["record"]

        stop = harvest_process.run([*HARVEST, "stop", "run"], cwd=tmp_path, env=env, capture_output=True, text=True,
                                   timeout=120)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert f"runner pid {first.pid}: exited after" in stop.stdout and "(outcome: interrupted)" in stop.stdout
        assert "verdict: CLEAN" in stop.stdout and "resume it with: harvest run job.toml --detach" in stop.stdout
        counts = statuses(run_dir)
        assert "running" not in counts and N - HOLD_AFTER - 2 <= counts.get("pending", 0), counts
        assert set(attempts(run_dir)) <= {0, 1}
        assert sum(1 for a in attempts(run_dir) if a == 0) == counts["pending"]  # nothing charged for the stop
        assert group_gone(engine["pgid"]) and not runner.alive(first)
        ended = follow(term, time.monotonic() + 30)
        assert ended == 1, term.screens[-1].text  # the run's session ended interrupted (130): not finished
        assert "interrupted" in term.screens[-1].text

        # the same command again: resumed, watched to its end
        term.stop()
        term = Terminal(tmp_path / "watch-2")
        again = harvest_process.run([*HARVEST, "run", "job.toml", "--detach"], cwd=tmp_path, env=env,
                                    capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
        second = runner.read(run_dir)
        assert again.returncode == 0, again.stdout + again.stderr
        assert second is not None and second.pid != first.pid
        status = watch_in_terminal(term, tmp_path, env, time.monotonic() + 300)
        assert status == 0, term.screens[-1].text
        assert any(s.frames() for s in term.screens), "the watch drew no panel"
        # The watch's own last line, or (its line redrawn away by the panel's last frame) the pane's
        # record of the watch command's exit code, which is the run's.
        last = term.screens[-1].text.replace("\n", " ")
        assert "finished, exit code 0" in last or "[command exited 0]" in last, last
    finally:
        term.stop()
        for record in (first, second):  # whatever this test started and left, by its record
            if record is not None and runner.alive(record):
                runner.stop(record, deadline_s=60)
    assert statuses(run_dir) == {"done": N} or set(statuses(run_dir)) <= {"done", "truncated"}
    assert ids_once(run_dir) == (N, 0)
    last = json.loads((run_dir / "server" / "launch.json").read_text())["record"]
    assert group_gone(last["pgid"])

    report = harvest_process.run([*HARVEST, "report", "run"], cwd=tmp_path, env=env, capture_output=True, text=True,
                                 timeout=120)
    assert report.returncode == 0, report.stderr
    page = (run_dir / "report.html").read_text()
    sessions = re.findall(r'data-session-end="(\w*)"', page)
    assert sessions == ["interrupted", "finished"], sessions
    logs = re.findall(r'<a href="([^"]+)" data-launch-log="(\d+)"', page)
    assert [n for _, n in logs] == ["1", "2"] and logs[0][0] == "server/launches/1/server.log", logs
    assert all((run_dir / href).is_file() for href, _ in logs)
    for pid in (engine["pid"], last["pid"]):
        assert f">{pid}<" in page
    assert second is not None and not runner.alive(second)
