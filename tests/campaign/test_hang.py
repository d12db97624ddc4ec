"""A hung engine, left alone: `harvest run` finds it and ends well.

The engine is a real llama-server behind ``tests/hang_engine.py``, a loopback proxy that holds every
completion after N answers while ``/health``, ``/v1/models`` and ``/metrics`` are still answered
(the engine behind it idle: no token counted), as a wedged scheduler does (vLLM #13134).

- managed, hangs after 40 answers: found hung, stopped (verified; no process of it left) and
  relaunched; 300/300 with every id exactly once, within its bounds of its last answer; the log,
  timeline.json and the report say "hung: no answer for N s while /health answered; relaunched".
- unmanaged, hangs after 20 answers: no more requests to it; the run ends by itself, exit 1, naming
  the hang and what to do, nothing failed, nothing charged.

The bounds are the tiny model's scale, not a large model's: its answers take a tenth of a second,
so a quiet spell of ``hang_floor`` = 5 s (30 s by default) is a hang, a launched server is relaunched
after ``hang_deadline`` = 20 s of it (120 s) and an endpoint of its own is given up after
``health_deadline`` = 15 s.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from tests import engines, harvest_process
from tests.campaign.ledger_peek import _query, attempts, statuses
from tests.campaign.test_give_up import PREFLIGHT, data, group_gone, harvest_run
from tests.hosts.conftest import write_toml

pytestmark = [pytest.mark.engine, pytest.mark.slow]

N = 300
HANG_ENGINE = Path(engines.ROOT) / "tests" / "hang_engine.py"
#: [client] bounds at the tiny model's scale (see above).
HANG_FLOOR, HANG_DEADLINE, HEALTH_DEADLINE = 5, 20, 15
#: The bound of a quiet spell, then hang_deadline, and room for the stop, the relaunch and a loaded
#: 2-core machine.
WITHIN = HANG_FLOOR + HANG_DEADLINE + 90


def ids_once(run_dir: Path) -> tuple[int, int]:
    """(ids with a result, results beyond one per id)."""
    rows = _query(run_dir, "SELECT i.id, COUNT(*) FROM results r JOIN items i ON i.seq = r.item GROUP BY i.id")
    return len(rows), sum(count - 1 for _, count in rows)


def test_managed_engine_that_hangs_is_stopped_relaunched_and_the_run_finishes(tmp_path, llama_server_bin,
                                                                             tiny_gguf):
    run_dir, marker = tmp_path / "run", tmp_path / "hung-once"
    job = write_toml(tmp_path / "job.toml", {
        "server": {"engine": "llamacpp", "model": str(tiny_gguf), "port": engines.free_port(),
                   "command": [sys.executable, str(HANG_ENGINE), "--hang-after", "40", "--once", str(marker),
                               "--", llama_server_bin],
                   "max_running_requests": 4, "extra_args": ["-c", "8192"]},
        "preflight": PREFLIGHT, "data": {"path": str(data(tmp_path)), "id_field": "id"},
        "client": {"hang_floor": HANG_FLOOR, "hang_deadline": HANG_DEADLINE},
        "sampling": {"max_tokens": 16}, "output": {"dir": str(run_dir)}})
    proc = harvest_run(job, tmp_path)
    first = None
    try:
        deadline = time.monotonic() + 180
        while not marker.exists():  # the hang begins
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the engine never hung"
            time.sleep(0.1)
        hung_at = marker.stat().st_mtime
        first = json.loads((run_dir / "server" / "launch.json").read_text())["record"]
        out, _ = proc.communicate(timeout=WITHIN + 120)
        took = time.time() - hung_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "Traceback" not in out, out
    assert "hung: no answer for" in out and "while /health answered; relaunched (relaunch 1 of" in out, out
    assert "server relaunched 1 time(s)" in out, out
    assert took <= WITHIN, f"finished {took:.0f} s after the hang began"
    assert statuses(run_dir) == {"done": N} or set(statuses(run_dir)) <= {"done", "truncated"}, statuses(run_dir)
    assert ids_once(run_dir) == (N, 0)
    assert set(attempts(run_dir)) == {1}  # nothing charged for the hang
    assert first is not None and group_gone(first["pgid"]), f"the hung engine's group {first['pgid']} is left"
    timeline = json.loads((run_dir / "timeline.json").read_text())
    whys = [x["stop"].get("why") for x in timeline["launches"] if x.get("stop")]
    assert whys[0] and whys[0].startswith("hung: no answer for ") and whys[0].endswith(
        "while /health answered; relaunched"), whys
    page = harvest_process.run([sys.executable, "-m", "harvest", "report", str(run_dir), "-o",
                                str(tmp_path / "r.html")], capture_output=True, text=True, timeout=120)
    assert page.returncode == 0, page.stderr
    assert "while /health answered; relaunched" in (tmp_path / "r.html").read_text()


def test_unmanaged_endpoint_that_hangs_ends_the_run_naming_the_hang(tmp_path, llama_server_bin, tiny_gguf):
    port, marker, run_dir = engines.free_port(), tmp_path / "hung-once", tmp_path / "run"
    argv = [sys.executable, str(HANG_ENGINE), "--hang-after", "20", "--once", str(marker), "--",
            *engines.llama_argv(llama_server_bin, str(tiny_gguf), port)]
    server = engines.start_engine(argv, port=port, model=str(tiny_gguf), log_path=tmp_path / "engine.log",
                                  health="/health", timeout=60)
    job = write_toml(tmp_path / "job.toml", {
        "data": {"path": str(data(tmp_path)), "id_field": "id"}, "sampling": {"max_tokens": 16},
        "client": {"endpoints": [server.url], "health_deadline": HEALTH_DEADLINE, "hang_floor": HANG_FLOOR},
        "output": {"dir": str(run_dir)}})
    proc = harvest_run(job, tmp_path)
    try:
        deadline = time.monotonic() + 180
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the endpoint never hung"
            time.sleep(0.1)
        hung_at = marker.stat().st_mtime
        out, _ = proc.communicate(timeout=300)
        took = time.time() - hung_at
        still_up = server.proc.poll() is None
    finally:
        server.stop(grace=0)
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert still_up  # harvest does not own it: it never signals it
    assert proc.returncode == 1, out
    assert "Traceback" not in out, out
    assert f"{server.url} hung: no answer for " in out and "while /health answered" in out, out
    assert "restart the server, then run again to resume" in out, out
    # The bound's floor of nothing back, then health_deadline, then the end
    assert took <= HANG_FLOOR + HEALTH_DEADLINE + 40, f"ended {took:.0f} s after the hang began"
    counts = statuses(run_dir)
    assert set(counts) <= {"done", "truncated", "pending"} and counts.get("pending", 0) > 0, counts  # 0 failed
    assert set(attempts(run_dir)) <= {0, 1}
    assert sum(1 for a in attempts(run_dir) if a == 0) == counts["pending"]  # nothing charged for the hang
