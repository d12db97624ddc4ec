"""An endpoint that cannot list its models is not "down": ``harvest run`` as a person runs it, against
the deterministic chat stand-in (tests/quality/chat_engine.py) answering ``GET /v1/models`` with a
500 after a pause while ``/health`` answers 200 (what ``transformers serve`` 5.17 does on the GPU
machine while it scans the Hugging Face cache):

- launched and stopped by harvest (``engine = "command"``): every item finishes, and the screen
  names the 500 and the model asked for as configured;
- already running (``engine = "openai"``): the same;
- already running, with a model name it does not serve: one first request finds it, the run stops
  with the engine's own 404 text, shown once, exit 2, no item sent or charged;
- a port where nothing listens: "did not answer" within the start deadline, naming what came back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests import engines, harvest_process
from tests.campaign.ledger_peek import attempts, statuses

CHAT_ENGINE = Path(__file__).resolve().parents[1] / "quality" / "chat_engine.py"
N = 12
#: The stand-in's /v1/models: HTTP 500 after this pause (transformers took 3.6 s).
MODELS_FLAGS = ["--models-status", "500", "--models-delay", "1.5", "--served", "m1"]


@pytest.fixture(autouse=True)
def harvest_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("HARVEST_STATE_DIR", str(d))
    return d


def data(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"id": f"s{i}", "prompt": f"Line {i}."}) + "\n" for i in range(N)))
    return path


def write_job(tmp_path: Path, server: dict[str, object]) -> Path:
    job = {"server": server, "preflight": {"min_disk_free_gib": 0.05},
           "data": {"path": str(data(tmp_path))}, "sampling": {"max_tokens": 4},
           "client": {"concurrency": 3, "start_deadline": 15, "health_deadline": 20},
           "output": {"dir": str(tmp_path / "run")}}
    lines = []
    for name, table in job.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    path = tmp_path / "job.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def harvest_run(job: Path) -> subprocess.CompletedProcess[str]:
    return harvest_process.run([sys.executable, "-m", "harvest.cli.main", "run", str(job), "--no-live"],
                               capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL,
                               env={**os.environ, "COLUMNS": "200"})


def ledger_counts(run_dir: Path) -> tuple[dict[str, int], int]:
    """Items by status and the attempts charged, read straight from the ledger's SQLite file."""
    return statuses(run_dir), sum(attempts(run_dir))


class RunningEngine:
    """The stand-in started by this test (its own session, stopped by its pid)."""

    def __init__(self, tmp_path: Path, *flags: str):
        self.port = engines.free_port()
        self.log = tmp_path / "posts.log"
        self.proc = subprocess.Popen([sys.executable, str(CHAT_ENGINE), "--port", str(self.port), "--life", "200",
                                      "--request-log", str(self.log), *flags],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert self.proc.poll() is None and time.monotonic() < deadline, "the stand-in did not start"
            time.sleep(0.1)

    def posts(self) -> int:
        return len(self.log.read_text().splitlines()) if self.log.exists() else 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # the process this test started, by its pid
        self.proc.wait(timeout=30)


def assert_all_finished(proc: subprocess.CompletedProcess[str], run_dir: Path) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    counts, _ = ledger_counts(run_dir)
    # The stand-in's answers run to max_tokens: truncated, every one of them, none failed or pending.
    assert counts == {"truncated": N}, counts
    assert "GET /v1/models answered 500" in out, out
    assert "asking for 'm1' as configured" in out, out
    assert "server_down" not in out and "did not answer" not in out, out


@pytest.mark.engine
def test_a_managed_engine_whose_model_list_answers_500_finishes_every_item(tmp_path):
    command = [sys.executable, str(CHAT_ENGINE), "--host", "{host}", "--port", "{port}", *MODELS_FLAGS]
    job = write_job(tmp_path, {"engine": "command", "model": "m1", "port": engines.free_port(),
                               "command": command, "health_url": "http://{host}:{port}/health",
                               "ready_timeout": 30, "stop_grace": 2, "stop_deadline": 10})
    proc = harvest_run(job)
    assert_all_finished(proc, tmp_path / "run")
    assert "stop: clean" in proc.stdout + proc.stderr or "CLEAN" in proc.stdout + proc.stderr, proc.stdout


@pytest.mark.engine
def test_an_endpoint_whose_model_list_answers_500_finishes_every_item(tmp_path):
    engine = RunningEngine(tmp_path, *MODELS_FLAGS)
    try:
        job = write_job(tmp_path, {"engine": "openai", "base_url": engine.url + "/v1", "model": "m1"})
        proc = harvest_run(job)
        assert_all_finished(proc, tmp_path / "run")
        assert engine.posts() == N + 1  # every item once, and the one first request that checked the model
    finally:
        engine.stop()


@pytest.mark.engine
def test_a_wrong_model_name_is_found_by_one_first_request_and_nothing_is_charged(tmp_path):
    engine = RunningEngine(tmp_path, *MODELS_FLAGS)
    try:
        job = write_job(tmp_path, {"engine": "openai", "base_url": engine.url, "model": "m2"})
        proc = harvest_run(job)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 2, out
        assert out.count("The model `m2` does not exist.") == 1, out
        assert "GET /v1/models answered 500" in out and "[server] model" in out, out
        assert engine.posts() == 1  # the first request alone: no item was sent
        counts, attempts = ledger_counts(tmp_path / "run")
        assert counts == {"pending": N} and attempts == 0, (counts, attempts)
    finally:
        engine.stop()


def test_a_port_where_nothing_listens_is_down_after_the_start_deadline(tmp_path):
    port = engines.free_port()
    job = write_job(tmp_path, {"engine": "openai", "base_url": f"http://127.0.0.1:{port}", "model": "m1"})
    text = job.read_text().replace("start_deadline = 15", "start_deadline = 3")
    job.write_text(text)
    t0 = time.monotonic()
    proc = harvest_run(job)
    took = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert f"http://127.0.0.1:{port} did not answer within [client] start_deadline 3 s" in out, out
    assert "GET /v1/models refused the connection" in out, out
    assert took < 60, took  # the 20 s health deadline was not waited on top
    counts, attempts = ledger_counts(tmp_path / "run")
    assert counts == {"pending": N} and attempts == 0, (counts, attempts)
