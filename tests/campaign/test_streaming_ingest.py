"""Generation starts while the dataset is still being ingested, and an ingest killed half-way
resumes by position: nothing lost, nothing twice, duplicates across batches counted once.

The endpoint is a small real HTTP server in a thread of this test: on its first chat request it
reads the ledger file (read-only, its own SQLite connection) to see how far the ingest was. The
runs are real `harvest run` processes, with the ingest held after its first batch
(tests/campaign/held_ingest.py) where the order matters; the kill is SIGKILL by the pid this test
started.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from aiohttp import web

from tests import harvest_process
from tests.campaign.ledger_peek import orphan_results, results_count, statuses, unique_items

#: Records per ingest transaction in the held runs (tests/campaign/held_ingest.py); the plain resume
#: runs with the product's own (10,000) and reads the rest in one batch.
INGEST_BATCH = 1000
N = 2 * INGEST_BATCH + 123  # three ingest batches, the last one short
DUPLICATES = 7  # ids of the first batch repeated in the last one
BAD_LINE = INGEST_BATCH + 17  # a bad record deep in the file (the second batch)


def _ingest_state(run_dir: Path) -> dict | None:
    path = run_dir / "ledger.sqlite"
    if not path.exists():
        return None
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'ingest'").fetchone()
    except sqlite3.OperationalError:
        return None
    finally:
        conn.close()
    return json.loads(row[0]) if row else None


class Endpoint:
    """An OpenAI-style chat endpoint in its own thread, noting the ingest state at its first request."""

    def __init__(self, run_dir: Path, delay: float, gate: Path | None = None):
        self.run_dir = run_dir
        self.delay = delay
        self.gate = gate  # created once the first request has seen the ingest state
        self.first_seen: dict | None = None
        self.requests = 0
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self.port = 0

    async def _chat(self, request: web.Request) -> web.Response:
        await request.read()
        self.requests += 1
        if self.first_seen is None:
            self.first_seen = _ingest_state(self.run_dir) or {}
            if self.gate is not None:
                self.gate.touch()
        await asyncio.sleep(self.delay)
        return web.json_response({
            "id": "c", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        self._loop.run_forever()

    def __enter__(self) -> Endpoint:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _data(path: Path) -> Path:
    lines = []
    for i in range(N):
        if i + 1 == BAD_LINE:
            lines.append('{"id": "broken", "prompt": ')
        elif i >= N - DUPLICATES:
            j = i - (N - DUPLICATES)
            lines.append(json.dumps({"id": f"r{j}", "prompt": f"Row {j}."}))
        else:
            lines.append(json.dumps({"id": f"r{i}", "prompt": f"Row {i}."}))
    path.write_text("\n".join(lines) + "\n")
    return path


def _job(tmp_path: Path, url: str) -> Path:
    job = tmp_path / "job.toml"
    job.write_text(f'[data]\npath = "{_data(tmp_path / "in.jsonl")}"\nid_field = "id"\n'
                   f'[sampling]\nmax_tokens = 4\n'
                   f'[client]\nendpoints = ["{url}"]\nconcurrency = 32\nhealth_deadline = 30\n'
                   f'[output]\ndir = "{tmp_path / "run"}"\n[run]\nprogress_interval = 0.5\n')
    return job


def _check_complete(run_dir: Path) -> None:
    unique = N - DUPLICATES
    state = _ingest_state(run_dir)
    assert state["complete"] and state["rows"] == N and state["duplicates"] == DUPLICATES and state["skipped"] == 1
    assert unique_items(run_dir) == unique
    assert statuses(run_dir) == {"done": unique - 1, "skipped": 1}
    assert results_count(run_dir) == unique - 1 and orphan_results(run_dir) == 0


def _held_ingest(tmp_path: Path, job: Path) -> tuple[list[str], dict[str, str], Path]:
    """The command line with the ingest held after its first batch until ``tmp_path/gate`` exists
    (tests/campaign/held_ingest.py): what follows the first batch happens in a known order on any
    machine, however fast it reads the rest."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "HARVEST_TEST_INGEST_GATE": str(tmp_path / "gate"),
           "HARVEST_TEST_INGEST_BATCH": str(INGEST_BATCH),
           "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
    return [sys.executable, "-m", "tests.campaign.held_ingest", "run", str(job), "--no-live"], env, root


@pytest.mark.slow
def test_generation_starts_before_the_ingest_ends(tmp_path):
    run_dir = tmp_path / "run"
    # The rest of the ingest waits for the first request (at most 120 s): a run that waited for
    # the whole ingest before sending would send its first request only then, with the ingest complete.
    with Endpoint(run_dir, delay=0.0, gate=tmp_path / "gate") as ep:
        argv, env, root = _held_ingest(tmp_path, _job(tmp_path, ep.url))
        out = harvest_process.run(argv, capture_output=True, text=True, timeout=600, env=env, cwd=root)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    # The first request reached the server while the ledger held only part of the input.
    assert ep.first_seen is not None and ep.first_seen.get("complete") is False, ep.first_seen
    assert ep.first_seen["rows"] == INGEST_BATCH
    _check_complete(run_dir)
    assert ep.requests == N - DUPLICATES - 1  # one request per unique good item, none twice
    progress = json.loads((run_dir / "progress.json").read_text())
    assert progress["ingesting"] is False and progress["total"] == N - DUPLICATES
    assert progress["final_before_session"] + progress["done_this_session"] == N - DUPLICATES


@pytest.mark.slow
def test_sigkill_in_the_middle_of_the_ingest_then_resume(tmp_path):
    run_dir = tmp_path / "run"
    with Endpoint(run_dir, delay=0.01) as ep:
        job = _job(tmp_path, ep.url)
        # The ingest is held after its first batch and never let go, so the kill lands half-way
        # through it on any machine; the resume is the plain command.
        held, env, root = _held_ingest(tmp_path, job)
        proc = subprocess.Popen(held, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=root)
        try:
            end = time.monotonic() + 120
            while time.monotonic() < end:
                state = _ingest_state(run_dir)
                if state and state["rows"] >= INGEST_BATCH and results_count(run_dir) > 0:
                    break
                if proc.poll() is not None:
                    pytest.fail(f"the run ended (code {proc.returncode}) before the ingest had committed a batch")
                time.sleep(0.01)
            else:
                pytest.fail(f"no batch and no result committed within 120 s: {_ingest_state(run_dir)}")
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        state = _ingest_state(run_dir)
        assert not state["complete"] and state["rows"] == INGEST_BATCH, state
        assert orphan_results(run_dir) == 0
        done_before = results_count(run_dir)
        assert 0 < done_before <= INGEST_BATCH
        argv = [sys.executable, "-m", "harvest", "run", str(job), "--no-live"]
        out = harvest_process.run(argv, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    _check_complete(run_dir)
    assert results_count(run_dir) > done_before
