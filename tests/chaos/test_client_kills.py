"""R1: `harvest run` SIGKILLed, then resumed: nothing lost, nothing twice.

tests/campaign/test_kill_resume.py already kills at random moments (12 rounds, vLLM). Here:

- every kill lands *inside a ledger write transaction*, proved from outside through SQLite's WAL
  write lock in /proc/locks (see tests/chaos/killer.py); the ledger is checked after every kill
  (integrity_check, result <=> done/truncated, no committed result lost or rewritten), then a last
  resume must finish with every unique id done exactly once;
- a run that manages its own server is SIGKILLed: the engine outlives it; `harvest stop` from
  another shell cleans it up through the state file, and a resume after a second kill stops the
  server the dead session left behind before launching its own.

The engine is llama.cpp's llama-server on the tiny GGUF (ready in well under a second).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from harvest.net import port_bindable
from harvest.server import RunStatus, StateFile, stop_run
from tests import engines, harvest_process
from tests.chaos.killer import chaos_rounds, final_check, harvest_argv, wait_committed, write_data

pytestmark = [pytest.mark.engine, pytest.mark.slow]

ROUNDS = 12
EARLY = 5


def test_sigkill_inside_ledger_commits_then_resume(tmp_path, llama_server, env):
    n = 1200
    data = write_data(tmp_path / "in.jsonl", n, shared=4)  # the prefix order holds rows: they must come back
    run_dir = tmp_path / "run"
    job = tmp_path / "job.toml"
    job.write_text(
        f'[data]\npath = "{data}"\nid_field = "id"\n'
        f'[sampling]\nmax_tokens = 8\n'
        f'[client]\nendpoints = ["{llama_server.url}"]\nconcurrency = 16\nhealth_deadline = 60\n'
        f'[output]\ndir = "{run_dir}"\n'
        f'[run]\nprogress_interval = 0.5\n')
    argv = harvest_argv("run", str(job), "--no-live")
    rng = random.Random(2024)

    # Kills right after start-up: inside the first write transactions (schema, recovery, ingest).
    # The ingest's commit is held open 0.3 s (tests/chaos/slow_ingest.py), so that a poller on a
    # loaded machine cannot miss it and catch only the dispatch's commits after it.
    root = Path(__file__).resolve().parents[2]
    slow = [argv[0], "-m", "tests.chaos.slow_ingest", *argv[3:]]
    slow_env = {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)}
    early = chaos_rounds(slow, run_dir, kills=EARLY, mode="commit", rng=rng, env=slow_env,
                         commit_delay=(0.0, 0.2))
    # (A round that sees no commit for 30 s, on a starved machine, is killed anyway: a random kill.)
    assert early.problems == [] and early.kills["commit"] + early.commit_timeouts == EARLY, early
    assert early.commit_phases["ingest"] >= 1, early  # killed before the ingest had committed
    # One run gets going (its ingest commits, results follow), and dies anywhere.
    proc = harvest_process.popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        wait_committed(run_dir, 50, proc)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    # Kills among result commits: claims, completions, releases.
    late = chaos_rounds(argv, run_dir, kills=ROUNDS - EARLY, mode="commit", rng=rng, env=env,
                        commit_delay=(0.0, 0.5))
    assert late.problems == [] and late.kills["commit"] + late.commit_timeouts == ROUNDS - EARLY, late
    assert late.commit_phases["dispatch"] == late.kills["commit"], late
    assert 50 <= late.results_per_round[-1] < n, late  # work is left for the resume

    final = harvest_process.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert final.returncode == 0, final.stdout + final.stderr
    assert final_check(run_dir, n) == []
    status = harvest_process.run(harvest_argv("status", str(run_dir), "--json"), capture_output=True, text=True,
                                 timeout=60, env=env)
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    assert sum(doc["counts"].values()) == n and doc["totals"]["ok"], doc["totals"]


def _engine(run_dir: Path) -> psutil.Process:
    """The engine recorded in the run's launch record, verified by its create time."""
    rec = json.loads((run_dir / "server" / "launch.json").read_text())["record"]
    p = psutil.Process(rec["pid"])
    assert abs(p.create_time() - rec["create_time"]) < 0.05
    return p


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_run_managing_its_server_killed_then_stop_from_another_shell_and_resume(
        tmp_path, llama_server_bin, tiny_gguf, env):
    n = 600
    data = write_data(tmp_path / "in.jsonl", n, shared=4)  # the prefix order holds rows: they must come back
    run_dir = tmp_path / "run"
    port = engines.free_port()
    job = tmp_path / "job.toml"
    job.write_text(
        f'[server]\nengine = "llamacpp"\nmodel = "{tiny_gguf}"\ncommand = ["{llama_server_bin}"]\n'
        f'port = {port}\nmax_running_requests = 8\nextra_args = ["-c", "16384"]\n'
        f'ready_timeout = 60\nstop_grace = 3\nstop_deadline = 20\n'
        f'[preflight]\nmin_disk_free_gib = 0.1\nram_reserve_gib = 0\n'
        f'[data]\npath = "{data}"\nid_field = "id"\n'
        f'[sampling]\nmax_tokens = 8\n'
        f'[client]\nconcurrency = 8\nhealth_deadline = 60\n'
        f'[output]\ndir = "{run_dir}"\n'
        f'[run]\nprogress_interval = 0.5\n')
    argv = harvest_argv("run", str(job), "--no-live")
    leftovers: list[psutil.Process] = []

    def run_and_kill(at_least: int) -> psutil.Process:
        proc = harvest_process.popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        try:
            wait_committed(run_dir, at_least, proc)
            engine = _engine(run_dir)
            leftovers.append(engine)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)  # the `harvest run` this test started, by its pid
            proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        return engine

    try:
        # 1. The supervisor (the run) dies; its engine lives on, holding the port.
        first = run_and_kill(100)
        assert _alive(first) and not port_bindable("127.0.0.1", port)
        # `harvest stop` from another shell cleans it up through the run's state file.
        stop = harvest_process.run(harvest_argv("stop", str(run_dir / "server"), "--json", "--deadline", "15"),
                                   capture_output=True, text=True, timeout=60, env=env)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert json.loads(stop.stdout)["verdict"] == "clean"
        assert not _alive(first) and port_bindable("127.0.0.1", port)

        # 2. Resumed and killed again: this time nobody stops the engine it left behind...
        second = run_and_kill(400)
        assert second.pid != first.pid and _alive(second)

        # 3. ...so the resume must: a verified stop of the leftover, then its own launch.
        final = harvest_process.run(argv, capture_output=True, text=True, timeout=300, env=env)
        assert final.returncode == 0, final.stdout + final.stderr
        assert not _alive(second)
        assert "left running by an earlier session" in final.stderr + final.stdout
        assert final_check(run_dir, n) == []
        assert port_bindable("127.0.0.1", port)  # the run's own server was stopped at its end
    finally:
        record = StateFile(run_dir / "server")
        if record.exists() and record.read().status is not RunStatus.STOPPED:
            stop_run(record.run_dir, deadline=15)  # harvest's own verified stop, by the record
        for p in leftovers:  # only engines this test's runs launched, verified by create time
            if _alive(p):
                p.kill()
