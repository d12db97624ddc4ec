"""The Python API as strict as the command line, against bench/sim_engine.py on loopback (and, for
the clean stop, run by harvest itself as an engine `command`): ``export`` refuses to write nothing
as ``harvest export`` does; ``statuses="truncated"`` is one status; cancelling the task of
``arun`` is the clean stop SIGINT is (in-flight items back to pending, the engine's verified stop);
and inside ``arun`` no SQLite statement and no file write of the run runs on the event loop's
thread (the loop a notebook shares is never held up by the disk)."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

import harvest
from harvest.ledger import Status
from tests.campaign import ledger_peek
from tests.engines import SIM_ENGINE, free_port, sim_engine


def rows(folder: Path, n: int) -> Path:
    data = folder / "p.jsonl"
    data.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"say {i}"}) + "\n" for i in range(n)))
    return data


def test_export_refuses_nothing_as_the_command_does_and_takes_one_status_as_a_string(tmp_path):
    with sim_engine("--output-tokens", "2") as url:
        run = harvest.run(engine="openai", base_url=url + "/v1", model="sim-model", data=rows(tmp_path, 5),
                          out=tmp_path / "run", max_tokens=8)
    assert run.ok and run.counts["done"] == 5, run.counts
    # nothing of the asked status: refused, the counts and the fix said, no file written
    with pytest.raises(harvest.HarvestError, match=r"no item of status truncated to export \(the run holds done "
                                                   r"5\): pick other statuses"):
        harvest.export(run.run_dir, "sharegpt", statuses="truncated", output=tmp_path / "t.jsonl")
    assert not (tmp_path / "t.jsonl").exists()
    with pytest.raises(harvest.HarvestError, match=r"--format logprobs: none of the run's 5 selected results "
                                                   r"carries log-probabilities"):
        harvest.export(run.run_dir, "logprobs", output=tmp_path / "lp.parquet")
    assert not (tmp_path / "lp.parquet").exists()
    empty = harvest.export(run.run_dir, "sharegpt", statuses="truncated", output=tmp_path / "t.jsonl",
                           allow_empty=True)
    assert empty.written == 0 and (tmp_path / "t.jsonl").read_text() == ""
    # a string is one status (or a comma-separated list), never its letters
    one = harvest.export(run.run_dir, "sharegpt", statuses="done", output=tmp_path / "d.jsonl")
    both = harvest.export(run.run_dir, "sharegpt", statuses="done,truncated", output=tmp_path / "b.jsonl")
    assert one.written == both.written == 5 and dict(one.by_status) == {"done": 5}


def test_cancelling_arun_is_a_clean_stop_and_nothing_runs_on_the_loop_thread(tmp_path, monkeypatch):
    import harvest.ledger.schema as schema
    import harvest.ledger.store as store
    from harvest import safefiles

    monkeypatch.setenv("HARVEST_STATE_DIR", str(tmp_path / "state"))
    on_loop: list[str] = []
    loop_thread: dict[str, int] = {}
    connect = schema.connect

    def traced(*args, **kwargs):  # every statement of every ledger connection, with the thread it ran on
        conn = connect(*args, **kwargs)
        conn.set_trace_callback(lambda sql: on_loop.append(f"SQL {sql[:60]}")
                                if threading.get_ident() == loop_thread.get("id") else None)
        return conn

    write_atomic = safefiles.Folder.write_atomic

    def written(self, name, *args, **kwargs):
        if threading.get_ident() == loop_thread.get("id"):
            on_loop.append(f"write {name}")
        return write_atomic(self, name, *args, **kwargs)

    monkeypatch.setattr(schema, "connect", traced)
    monkeypatch.setattr(store, "connect", traced)
    monkeypatch.setattr(safefiles.Folder, "write_atomic", written)
    port = free_port()
    job = {"engine": "command", "out": tmp_path / "run", "data": rows(tmp_path, 40), "max_tokens": 20,
           "concurrency": 4, "settings": {
               "server.command": [sys.executable, str(SIM_ENGINE), "--port", "{port}", "--token-latency", "0.25"],
               "server.port": port, "server.health_url": "http://{host}:{port}/health", "server.model": "sim-model",
               "server.stop_grace": 1, "preflight.min_disk_free_gib": 0}}
    run_dir = tmp_path / "run"

    async def notebook() -> None:
        loop_thread["id"] = threading.get_ident()
        task = asyncio.create_task(harvest.arun(**job))
        deadline = time.monotonic() + 60
        while ledger_peek.statuses(run_dir).get("running", 0) < 4:  # requests in flight, none finished
            assert not task.done() and time.monotonic() < deadline, "no item in flight within 60 s"
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(notebook())
    loop_thread.clear()  # the loop has ended: what follows runs on this thread by design
    statuses = ledger_peek.statuses(run_dir)
    assert statuses.get("running", 0) == 0 and statuses.get("pending", 0) > 0, statuses  # back to pending
    stop = json.loads((run_dir / "server" / "stop.json").read_text())
    assert stop["verdict"] == "clean" and not stop["survivors"], stop  # the engine's verified stop
    pid = json.loads((run_dir / "server" / "launch.json").read_text())["record"]["pid"]
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    st = harvest.status(run_dir)
    assert st.runner.recorded_state == "interrupted" and not any("killed" in n for n in st.notes), st.notes
    assert st.counts[Status.RUNNING] == 0
    assert on_loop == [], on_loop[:10]


#: A program that uses harvest from Python: SIGINT mid-run (as Ctrl-C in a terminal), with the
#: modules imported while its event loop runs recorded.
SCRIPT = """
import asyncio, json, os, signal, sqlite3, sys, threading, time
url, data, out = sys.argv[1:4]
on_loop = []

class Seen:
    def find_spec(self, name, path=None, target=None):
        if asyncio._get_running_loop() is not None:
            on_loop.append(name)
        return None

sys.meta_path.insert(0, Seen())
import harvest

def interrupt():
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            db = sqlite3.connect(f"file:{out}/ledger.sqlite?mode=ro", uri=True)
            try:
                if db.execute("SELECT COUNT(*) FROM items WHERE status = 'running'").fetchone()[0] >= 2:
                    break
            finally:
                db.close()
        except sqlite3.Error:
            pass
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=interrupt, daemon=True).start()
r = harvest.run(engine="openai", base_url=url, model="sim-model", data=data, out=out, max_tokens=20, concurrency=4)
print(json.dumps({"outcome": r.outcome, "counts": dict(r.counts), "on_loop": on_loop}))
"""


def test_the_library_prints_nothing_and_imports_the_campaign_off_the_loop(tmp_path):
    import subprocess

    with sim_engine("--token-latency", "0.2") as url:
        out = subprocess.run([sys.executable, "-c", SCRIPT, url + "/v1", str(rows(tmp_path, 20)), str(tmp_path / "run")],
                             capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stderr == "", out.stderr  # "stop requested ..." is the library's log, not a print
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["outcome"] == "interrupted" and doc["counts"]["running"] == 0, doc
    # the campaign's modules (ledger, client, numpy...) are imported on a worker thread: the first
    # arun in a notebook does not hold its loop up for the imports
    heavy = [n for n in doc["on_loop"] if n.split(".")[0] in ("numpy", "aiohttp", "pyarrow")
             or n.startswith(("harvest.campaign", "harvest.ledger", "harvest.client", "harvest.placement"))]
    assert heavy == [], heavy
