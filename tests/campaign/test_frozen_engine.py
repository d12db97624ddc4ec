"""What happened is kept, and a managed engine frozen whole is relaunched within the hang bound: a
real llama-server harvest launches, its group SIGKILLed, then SIGSTOPped for a while and continued,
then SIGSTOPped and left so.

- killed mid-run: relaunched; the first launch's log, record and stop report survive in the run
  folder (``server/launches/1/``), and the report links every launch's log;
- frozen, then continued before its hang deadline: the line says ``/health`` did not answer (the
  probes side by side: never "while /health answered" of an engine frozen whole), and the run goes
  on without a relaunch;
- frozen and left so (``/health`` silent too): stopped, verified, and relaunched within the hang
  bound (the quiet spell's floor, the probes, ``hang_deadline``), far from ``health_deadline``;
- the run finishes: every item exactly once, nothing charged for the engine's faults.

The config is the default but for the scale of the hang bound: the tiny model answers in a tenth of a
second, so a quiet spell of ``hang_floor`` = 2 s is a hang and ``hang_deadline`` = 6 s its deadline
(30 s and 120 s by default); ``health_deadline`` stays at its default 600 s. The defaults themselves
are checked in tests/campaign/test_hang_bound.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harvest.client.policy import RetryPolicy
from tests import engines, harvest_process
from tests.campaign.ledger_peek import attempts, results_count, statuses
from tests.campaign.test_give_up import PREFLIGHT, data, group_gone, harvest_run
from tests.campaign.test_hang import ids_once
from tests.hosts.conftest import write_toml

pytestmark = [pytest.mark.engine, pytest.mark.slow]

#: Enough items for the four steps (about 260 answers) with about a hundred left after the last
#: relaunch, the run finishing a few seconds after it.
N = 400
HANG_FLOOR, HANG_DEADLINE = 2, 6
#: The hang bound of a frozen engine: the quiet spell's floor, a first reading of its token counter
#: and then the counter and /health side by side (each a probe's timeout, 10 s), hang_deadline; with
#: room for the verified stop, the relaunch and a loaded 2-core machine. health_deadline is 600 s.
HANG_BOUND = HANG_FLOOR + 2 * RetryPolicy().probe_timeout + HANG_DEADLINE + 30


class Output:
    """The run's output lines as they come (a thread reads its pipe)."""

    def __init__(self, proc: subprocess.Popen[str]):
        self.lines: list[str] = []
        assert proc.stdout is not None
        self._thread = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self._thread.start()

    def _read(self, pipe) -> None:  # type: ignore[no-untyped-def]
        for line in pipe:
            self.lines.append(line)

    def text(self) -> str:
        return "".join(self.lines)

    def join(self) -> None:
        self._thread.join(timeout=30)


def launch(run_dir: Path, within: float = 30.0) -> dict:
    """The current launch record. Between a launch's files moved into launches/N and the next
    launch's record written it is briefly absent: read again, within ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        try:
            return json.loads((run_dir / "server" / "launch.json").read_text())
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def wait(what: str, predicate, proc: subprocess.Popen[str], out: Output, timeout: float) -> float:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    while not predicate():
        assert proc.poll() is None, f"the run ended before {what}:\n{out.text()}"
        assert time.monotonic() - t0 < timeout, f"not {what} within {timeout:.0f} s:\n{out.text()[-3000:]}"
        time.sleep(0.1)
    return time.monotonic() - t0


def test_killed_then_frozen_engines_keep_their_logs_and_are_relaunched_within_the_hang_bound(
        tmp_path, llama_server_bin, tiny_gguf):
    run_dir = tmp_path / "run"
    job = write_toml(tmp_path / "job.toml", {
        "server": {"engine": "llamacpp", "model": str(tiny_gguf), "command": [llama_server_bin],
                   "port": engines.free_port(), "extra_args": ["-c", "4096"]},
        "preflight": PREFLIGHT, "data": {"path": str(data(tmp_path, N)), "id_field": "id"},
        "sampling": {"max_tokens": 48},
        "client": {"concurrency": 2, "hang_floor": HANG_FLOOR, "hang_deadline": HANG_DEADLINE},
        "output": {"dir": str(run_dir)}})
    proc = harvest_run(job, tmp_path)
    out = Output(proc)
    groups = []
    try:
        wait("100 results", lambda: results_count(run_dir) >= 100, proc, out, 120)
        first = launch(run_dir)["record"]
        groups.append(first["pgid"])
        os.killpg(first["pgid"], signal.SIGKILL)  # the engine dies (an OOM kill, a core dump)
        wait("relaunched after the kill", lambda: launch(run_dir)["record"]["launch"] == 2
             and launch(run_dir)["status"] == "ready", proc, out, 120)
        second = launch(run_dir)["record"]
        groups.append(second["pgid"])

        done = results_count(run_dir)
        wait("100 more results", lambda: results_count(run_dir) >= done + 100, proc, out, 60)
        os.killpg(second["pgid"], signal.SIGSTOP)  # frozen whole: /health silent too
        mark = len(out.lines)
        wait("found not answering", lambda: "/health did not answer" in "".join(out.lines[mark:]), proc, out,
             HANG_BOUND)
        os.killpg(second["pgid"], signal.SIGCONT)  # ... and back, before its hang deadline
        frozen_line = next(line for line in out.lines[mark:] if "/health did not answer" in line)
        done = results_count(run_dir)
        wait("answers again", lambda: results_count(run_dir) >= done + 50, proc, out, 60)
        assert launch(run_dir)["record"]["launch"] == 2, "relaunched although it came back"

        os.killpg(second["pgid"], signal.SIGSTOP)  # frozen whole, and left so
        took = wait("relaunched after the freeze", lambda: launch(run_dir)["record"]["launch"] == 3, proc, out,
                    HANG_BOUND + 60)
        groups.append(launch(run_dir)["record"]["pgid"])
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    out.join()
    text = out.text()
    assert proc.returncode == 0, text
    assert re.search(r"not answering: no answer for \d+ s and /health did not answer", frozen_line), frozen_line
    assert "while /health answered" not in text, text
    assert took <= HANG_BOUND, f"relaunched {took:.0f} s after the freeze (bound {HANG_BOUND} s)"
    assert re.search(r"/health did not answer; not healthy for \d+ s \(past \[client\] hang_deadline 6 s\); "
                     r"relaunched \(relaunch 2 of 5\)", text), text
    assert "server relaunched 2 time(s)" in text, text
    assert statuses(run_dir) == {"done": N} or set(statuses(run_dir)) <= {"done", "truncated"}, statuses(run_dir)
    assert ids_once(run_dir) == (N, 0) and set(attempts(run_dir)) == {1}  # nothing charged
    assert all(group_gone(g) for g in groups), groups

    kept = run_dir / "server" / "launches"
    assert json.loads((kept / "1" / "launch.json").read_text())["record"]["pid"] == first["pid"]
    assert "llama" in (kept / "1" / "server.log").read_text()  # the killed engine's own log, kept
    assert (kept / "2" / "stop.json").is_file() and (kept / "2" / "server.log").is_file()
    page_file = tmp_path / "r.html"
    report = harvest_process.run([sys.executable, "-m", "harvest", "report", str(run_dir), "-o", str(page_file)],
                                 capture_output=True, text=True, timeout=120,
                                 env={**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")})
    assert report.returncode == 0, report.stderr
    page = page_file.read_text()
    links = re.findall(r'<a href="([^"]+)" data-launch-log="(\d+)"', page)
    assert [n for _, n in links] == ["1", "2", "3"], links
    assert all((tmp_path / href).is_file() for href, _ in links), links  # relative to the page's folder
    assert links[0][0] == "run/server/launches/1/server.log"
    assert "the server exited (code -9); relaunched" in page and "/health did not answer" in page
