"""Where `harvest run` gives up, on real llama-server processes, as the user sees it.

- ``server_down``: an endpoint harvest does not manage dies and stays down past [client]
  health_deadline; a managed server that dies with its relaunches used up (max_relaunches = 0); a
  managed server that stops answering (frozen by SIGSTOP, alive) past health_deadline with no
  relaunch left. Each: exit 1, the line that names why, the ledger's counts (nothing failed,
  nothing charged for the outage, every unfinished item pending) and no process of ours left.
- An engine binary that fails to start (missing; or the real llama-server refusing an argument):
  one ``error: the server did not start`` line naming it, exit 1, no item touched.
- Ctrl-C while the engine is still launching (llama-server behind a ``sleep`` standing for a large
  model's load): exit 130 well before the launch would have ended, nothing left running.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.placed import run_campaign
from harvest.config import parse_config
from harvest.ledger import Status
from tests import engines, harvest_process
from tests.campaign.ledger_peek import attempts, results_count, statuses
from tests.hosts.conftest import write_toml

pytestmark = [pytest.mark.engine, pytest.mark.slow]

N = 300
PREFLIGHT = {"min_disk_free_gib": 0.1, "ram_reserve_gib": 0}
#: Seconds a give-up may take beyond its own budget on a loaded 2-core machine.
MARGIN = 20.0


def data(tmp_path: Path, n: int = N) -> Path:
    path = tmp_path / "in.jsonl"
    rows = (json.dumps({"id": f"g{i}", "prompt": f"Give up {i}, go on."}) for i in range(n))
    path.write_text("".join(r + "\n" for r in rows))
    return path


def managed(llama_server_bin: str, tiny_gguf: Path, **over: object) -> dict[str, object]:
    table: dict[str, object] = {
        "engine": "llamacpp", "model": str(tiny_gguf), "command": [llama_server_bin],
        "port": engines.free_port(),
        "max_running_requests": 4, "extra_args": ["-c", "8192"], "ready_timeout": 60, "stop_grace": 2,
        "stop_deadline": 15}
    table.update(over)
    return table


def harvest_run(job: Path, tmp_path: Path, **kw: object) -> subprocess.Popen[str]:
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}
    return harvest_process.popen([sys.executable, "-m", "harvest", "run", str(job), "--no-live"], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def wait_results(run_dir: Path, at_least: int, alive: object, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while results_count(run_dir) < at_least:
        assert alive(), "the run ended before the fault"  # type: ignore[operator]
        assert time.monotonic() < deadline, f"fewer than {at_least} results within {timeout} s"
        time.sleep(0.05)


def assert_nothing_charged(run_dir: Path) -> dict[str, int]:
    """Every item either done (one attempt, its result kept) or pending with no attempt charged."""
    counts = statuses(run_dir)
    assert set(counts) <= {"done", "truncated", "pending"}, counts  # nothing failed, nothing left running
    assert counts.get("pending", 0) > 0, f"the fault came too late to leave anything pending: {counts}"
    assert results_count(run_dir) == counts.get("done", 0) + counts.get("truncated", 0) > 0, counts
    assert sum(counts.values()) == N
    assert sorted(set(attempts(run_dir))) == [0, 1]  # pending items: 0; finished ones: 1 (max_retries 0)
    return counts


def group_gone(pgid: int) -> bool:
    """Measured: no live (non-zombie) process left in process group ``pgid``."""
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                return False
        except (ProcessLookupError, psutil.Error):
            continue
    return True


def test_server_down_unmanaged_endpoint_stays_down_past_health_deadline(tmp_path, llama_server_bin,
                                                                         tiny_gguf):
    port = engines.free_port()
    server = engines.start_engine(engines.llama_argv(llama_server_bin, str(tiny_gguf), port), port=port,
                                  model=str(tiny_gguf), log_path=tmp_path / "llama.log", health="/health",
                                  timeout=60)
    run_dir = tmp_path / "run"
    health_deadline = 4
    job = write_toml(tmp_path / "job.toml", {
        "data": {"path": str(data(tmp_path)), "id_field": "id"}, "sampling": {"max_tokens": 48},
        "client": {"endpoints": [server.url], "concurrency": 4, "health_deadline": health_deadline,
                   "max_retries": 0},
        "output": {"dir": str(run_dir)}, "run": {"progress_interval": 0.5}})
    proc = harvest_run(job, tmp_path)
    try:
        wait_results(run_dir, 20, lambda: proc.poll() is None)
        server.stop(grace=0)  # the endpoint the test started dies and is never restarted
        killed = time.monotonic()
        out, _ = proc.communicate(timeout=health_deadline + 120)
        took = time.monotonic() - killed
    finally:
        server.stop(grace=0)
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 1, out
    assert "(server_down; every endpoint stayed down past [client] health_deadline)" in out, out
    assert "Traceback" not in out, out
    assert took <= health_deadline + MARGIN, f"gave up {took:.1f} s after the loss ({health_deadline = })"
    assert_nothing_charged(run_dir)


@pytest.mark.parametrize("fault", ["exited", "frozen"])
def test_server_down_managed_server_with_no_relaunch_left(tmp_path, llama_server_bin, tiny_gguf, fault):
    """exited: its whole group SIGKILLed; frozen: SIGSTOPped (alive, silent). max_relaunches = 0.

    A silent server holds the requests on its wire until [client] request_timeout (then its health
    probe fails too: held, uncharged, down after health_deadline), so that bound is set here."""
    run_dir = tmp_path / "run"
    health_deadline, request_timeout = 4, 10
    config = parse_config({
        "server": managed(llama_server_bin, tiny_gguf), "preflight": PREFLIGHT,
        "data": {"path": str(data(tmp_path)), "id_field": "id"}, "sampling": {"max_tokens": 48},
        "client": {"concurrency": 4, "health_deadline": health_deadline, "max_retries": 0,
                   "request_timeout": request_timeout},
        "output": {"dir": str(run_dir)}, "run": {"progress_interval": 0.5, "max_relaunches": 0}})
    pgid = None

    async def scenario():
        nonlocal pgid
        task = asyncio.create_task(run_campaign(config))
        deadline = time.monotonic() + 120
        while results_count(run_dir) < 20:
            assert not task.done(), "the run ended before the fault"
            assert time.monotonic() < deadline, "no progress before the fault"
            await asyncio.sleep(0.05)
        record = json.loads((run_dir / "server" / "launch.json").read_text())["record"]
        pgid = record["pgid"]
        # The group harvest launched (from its launch record), as an outage would hit it.
        os.killpg(pgid, signal.SIGKILL if fault == "exited" else signal.SIGSTOP)
        t = time.monotonic()
        report = await asyncio.wait_for(task, timeout=300)
        return report, time.monotonic() - t

    report, took = asyncio.run(scenario())
    assert report.outcome == "server_down" and not report.ok, report
    why = ("the managed server exited and relaunches are used up" if fault == "exited"
           else "every endpoint stayed down past [client] health_deadline")
    assert report.note == why and report.relaunches == 0
    # request_timeout (frozen), health_deadline, then the stop's own deadline (15 s)
    assert took <= request_timeout + health_deadline + 15 + MARGIN, took
    assert len(report.stop_reports) == 1 and report.stop_reports[0].clean, report.stop_reports[0].problems
    if fault == "frozen":  # a stopped process acts on SIGTERM once continued: SIGCONT after it, no SIGKILL
        sigterm = report.stop_reports[0].step("sigterm")
        assert sigterm is not None and "SIGCONT to" in sigterm.outcome, report.stop_reports[0].steps
    assert pgid is not None and group_gone(pgid), f"processes of group {pgid} left running"
    counts = assert_nothing_charged(run_dir)
    assert report.totals.counts[Status.PENDING] == counts["pending"]  # the report says what the file holds


@pytest.mark.parametrize("broken", ["missing-binary", "refused-argument"])
def test_engine_that_fails_to_start_is_one_line_and_touches_no_item(tmp_path, llama_server_bin, tiny_gguf,
                                                                     broken):
    run_dir = tmp_path / "run"
    if broken == "missing-binary":
        server = managed(llama_server_bin, tiny_gguf, command=[str(tmp_path / "no-such-llama-server")])
    else:  # the real llama-server, exiting at once on an argument it does not know
        server = managed(llama_server_bin, tiny_gguf, extra_args=["--no-such-harvest-flag"])
    job = write_toml(tmp_path / "job.toml", {
        "server": server, "preflight": PREFLIGHT, "data": {"path": str(data(tmp_path)), "id_field": "id"},
        "client": {"concurrency": 4, "max_retries": 0}, "output": {"dir": str(run_dir)}})
    t = time.monotonic()
    proc = harvest_run(job, tmp_path)
    out, _ = proc.communicate(timeout=120)
    took = time.monotonic() - t
    assert proc.returncode == 1, out
    lines = [ln for ln in out.splitlines() if ln.startswith("error: the server did not start")]
    assert len(lines) == 1, out
    named = "no-such-llama-server" if broken == "missing-binary" else "no-such-harvest-flag"
    assert named in out, out
    if broken == "missing-binary":  # named before preflight, with its field and where it comes from
        assert "no-such-llama-server does not exist ([server] command): scripts/install-engines llamacpp" in out
        assert "preflight: PASS" not in out, out
    assert "Traceback" not in out, out
    assert took < 60 + MARGIN, f"a launch that cannot start took {took:.1f} s (ready_timeout 60)"
    counts = statuses(run_dir)
    assert counts == {"pending": N} and set(attempts(run_dir)) == {0}, counts
    record_file = run_dir / "server" / "launch.json"
    if record_file.exists():  # something was started: its group is gone
        pgid = json.loads(record_file.read_text())["record"]["pgid"]
        assert group_gone(pgid)


def test_ctrl_c_while_the_engine_is_launching(tmp_path, llama_server_bin, tiny_gguf):
    run_dir = tmp_path / "run"
    load_s = 60  # the stand-in for a large model's load: the launch cannot be ready before it
    slow = ["sh", "-c", f'sleep {load_s}; exec "$0" "$@"', llama_server_bin]
    job = write_toml(tmp_path / "job.toml", {
        "server": managed(llama_server_bin, tiny_gguf, command=slow, ready_timeout=300),
        "preflight": PREFLIGHT,
        "data": {"path": str(data(tmp_path)), "id_field": "id"}, "client": {"concurrency": 4},
        "output": {"dir": str(run_dir)}})
    proc = harvest_run(job, tmp_path)
    record_file = run_dir / "server" / "launch.json"
    try:
        deadline = time.monotonic() + 60
        while not record_file.exists():
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "no launch record within 60 s"
            time.sleep(0.05)
        time.sleep(1.0)  # well inside the launch: the engine is sleeping, not ready
        pgid = json.loads(record_file.read_text())["record"]["pgid"]
        assert not group_gone(pgid), "the engine's group is not running yet"
        proc.send_signal(signal.SIGINT)  # Ctrl-C, to the harvest process this test started
        t = time.monotonic()
        out, _ = proc.communicate(timeout=load_s + 60)
        took = time.monotonic() - t
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 130, out
    assert "error: the server did not start" in out and "cancel" in out.lower(), out
    assert "Traceback" not in out, out
    assert took < load_s - 10, f"Ctrl-C waited {took:.1f} s: it did not give up the launch"
    assert group_gone(pgid), f"processes of group {pgid} left running"
    assert statuses(run_dir) == {"pending": N} and set(attempts(run_dir)) == {0}
