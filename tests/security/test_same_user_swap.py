"""The run folder swapped by its own user during a run: nothing outside it changes.

A second tool of the same user (a script that moves folders) renames the run folder away and puts
a symlink to another run folder of the user's in its place, at each stage of ``harvest run`` with a
managed llama-server: while the engine launches, mid-run, while the engine is stopped, and between
the run and its report. Every file of the run (the ledger, the server's records and log, the stop
report, the report) goes through the descriptor harvest holds from the ledger's open on, so:
the other run folder keeps every byte, mode and mtime and gains no file; the run's own engine is
gone (its pid and create time, from the record in the folder the run held); the run says the folder
was replaced, where its files are, and how to resume.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harvest.api import load_job
from harvest.campaign.outputs.status import run_status
from harvest.campaign.run import run_campaign
from harvest.cli.report import report_line
from harvest.errors import LedgerError
from harvest.placement import from_config
from harvest.report import REPORT_FILE
from tests import engines, harvest_process
from tests.security.test_refused_before_launch import port_free

pytestmark = [pytest.mark.engine]

REPLACED = "the run folder was replaced during the run"


def snapshot(folder: Path) -> dict[str, tuple[str, int, int]]:
    """Every file under ``folder``: its digest, mode and mtime (ns), by relative path."""
    out = {}
    for path in sorted(folder.rglob("*")):
        st = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(st.st_mode) else ""
        out[str(path.relative_to(folder))] = (digest, st.st_mode, st.st_mtime_ns)
    return out


def write_job(where: Path, run: Path, llama: str, gguf: Path, port: int, items: int, *, command: str | None = None,
              max_tokens: int = 4) -> Path:
    data = where / f"{run.name}.jsonl"
    data.write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"Count to {i}."}) + "\n" for i in range(items)))
    job = where / f"{run.name}.toml"
    job.write_text(
        f'[data]\npath = "{data}"\n[sampling]\nmax_tokens = {max_tokens}\n[output]\ndir = "{run}"\n'
        f'[server]\nengine = "llamacpp"\nmodel = "{gguf}"\ncommand = ["{command or llama}"]\nport = {port}\n'
        f'max_running_requests = 2\nextra_args = ["-c", "2048"]\nready_timeout = 60\nstop_grace = 3\n'
        f'stop_deadline = 20\n[client]\nconcurrency = 2\n'
        f'[preflight]\nmin_disk_free_gib = 0.05\nram_reserve_gib = 0\n')
    return job


def harvest(job: Path, tmp_path: Path, **kw: object) -> subprocess.Popen[str]:
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}
    return harvest_process.popen([sys.executable, "-m", "harvest", "run", str(job), "--no-live"], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 stdin=subprocess.DEVNULL, **kw)  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def victim_run(tmp_path_factory: pytest.TempPathFactory, llama_server_bin: str, tiny_gguf: Path) -> Path:
    """Another run folder of the user's, made by a whole `harvest run` (report included)."""
    where = tmp_path_factory.mktemp("victim")
    run = where / "other-run"
    proc = harvest(write_job(where, run, llama_server_bin, tiny_gguf, engines.free_port(), 6), where)
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    assert (run / "server" / "launch.json").is_file() and (run / "server" / "stop.json").is_file()
    assert (run / REPORT_FILE).is_file()
    return run


@pytest.fixture
def victim(victim_run: Path, tmp_path: Path) -> tuple[Path, dict[str, tuple[str, int, int]]]:
    """A copy of the other run (mtimes kept), with its snapshot taken now."""
    copy = tmp_path / "other-run"
    subprocess.run(["cp", "-a", str(victim_run), str(copy)], check=True, timeout=60)
    return copy, snapshot(copy)


def swap_script(run: Path, victim: Path) -> str:
    return f'mv "{run}" "{run}.moved" && ln -s "{victim}" "{run}"'


def engine_gone(held: Path) -> None:
    """The engine recorded in the folder the run held is gone (pid and create time), and its port is free."""
    rec = json.loads((held / "server" / "launch.json").read_text())["record"]
    try:
        p = psutil.Process(rec["pid"])
        alive = abs(p.create_time() - rec["create_time"]) < 0.05 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        alive = False
    assert not alive, f"the run's engine (pid {rec['pid']}) is still running"
    assert port_free(rec["port"])
    stop = json.loads((held / "server" / "stop.json").read_text())
    assert stop["verdict"] == "clean", stop


def check_after(out: str, code: int, run: Path, victim: Path, before: dict[str, tuple[str, int, int]]) -> Path:
    held = Path(f"{run}.moved")
    assert snapshot(victim) == before, "the other run folder changed"
    assert run.is_symlink() and os.readlink(run) == str(victim)
    assert "Traceback" not in out, out
    assert code == 1, out
    assert REPLACED in out and str(held) in out, out
    engine_gone(held)
    assert (held / REPORT_FILE).is_file(), out  # the report went to the folder the run held
    assert f"report: {held / REPORT_FILE}" in out, out
    return held


def test_a_swap_while_the_engine_launches(tmp_path, llama_server_bin, tiny_gguf, victim):
    """The engine's own start swaps the folder (right after the spawn, while the record is written):
    the launch is given up, the engine stopped through the folder held, the run says why."""
    other, before = victim
    run = tmp_path / "run"
    wrapper = tmp_path / "engine.sh"
    wrapper.write_text(f'#!/bin/sh\n{swap_script(run, other)}\nexec "{llama_server_bin}" "$@"\n')
    wrapper.chmod(0o700)
    proc = harvest(write_job(tmp_path, run, llama_server_bin, tiny_gguf, engines.free_port(), 20,
                             command=str(wrapper)), tmp_path)
    out, _ = proc.communicate(timeout=240)

    held = check_after(out, proc.returncode, run, other, before)
    assert (held / "server" / "server.log").stat().st_size > 0  # the engine's log went there too


def test_a_swap_mid_run(tmp_path, llama_server_bin, tiny_gguf, victim):
    """Swapped once 10 items are settled: the session stops (items in flight released, nothing
    lost), the engine is stopped, and the run resumes from the folder put back."""
    other, before = victim
    run = tmp_path / "run"
    items = 400
    job = write_job(tmp_path, run, llama_server_bin, tiny_gguf, engines.free_port(), items, max_tokens=24)
    proc = harvest(job, tmp_path)
    deadline = time.monotonic() + 180
    settled = 0
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            settled = run_status(run).settled
        except (LedgerError, sqlite3.Error, OSError):  # the ledger is not there (or not whole) yet
            settled = 0
        if settled >= 10:
            break
        time.sleep(0.2)
    assert settled >= 10 and proc.poll() is None, f"the run did not get going: {settled} settled"
    subprocess.run(["sh", "-c", swap_script(run, other)], check=True, timeout=30)
    out, _ = proc.communicate(timeout=240)

    held = check_after(out, proc.returncode, run, other, before)
    moved = run_status(held)
    assert moved.totals.unique == items and moved.settled < items, out  # stopped early, by the swap
    # Put back as the note says, the run resumes and finishes, every item exactly once.
    run.unlink()
    held.rename(run)
    again = harvest(job, tmp_path)
    out2, _ = again.communicate(timeout=600)
    assert again.returncode == 0, out2
    done = run_status(run)
    assert done.settled == items and done.totals.ok


def test_a_swap_while_the_engine_is_stopped(tmp_path, llama_server_bin, tiny_gguf, victim):
    """The engine swaps the folder when it is told to stop (SIGTERM): the stop report and the
    record go to the folder held; the run, finished, says the folder was replaced."""
    other, before = victim
    run = tmp_path / "run"
    wrapper = tmp_path / "engine.sh"
    wrapper.write_text(f'#!/bin/sh\n"{llama_server_bin}" "$@" &\nchild=$!\n'
                       f"trap '{swap_script(run, other)}; kill -TERM $child; wait $child; exit 0' TERM\n"
                       f"wait $child\n")
    wrapper.chmod(0o700)
    proc = harvest(write_job(tmp_path, run, llama_server_bin, tiny_gguf, engines.free_port(), 6,
                             command=str(wrapper)), tmp_path)
    out, _ = proc.communicate(timeout=240)

    held = check_after(out, proc.returncode, run, other, before)
    assert run_status(held).settled == 6


def test_a_swap_between_the_run_and_its_report(tmp_path, llama_server_bin, tiny_gguf, victim, monkeypatch):
    """The report of `harvest run` is read and written through the folder the run held: the other
    folder's report keeps its bytes, and the line printed names where the report is."""
    other, before = victim
    run = tmp_path / "run"
    config = load_job(write_job(tmp_path, run, llama_server_bin, tiny_gguf, engines.free_port(), 6))
    monkeypatch.setenv("HARVEST_STATE_DIR", str(tmp_path / "state"))
    report = asyncio.run(run_campaign(config, placement=from_config(config), writes=(REPORT_FILE,)))
    assert report.outcome == "finished" and report.folder is not None
    subprocess.run(["sh", "-c", swap_script(run, other)], check=True, timeout=30)

    line = report_line(report.run_dir, held=report.folder)
    report.folder.close()

    held = Path(f"{run}.moved")
    assert snapshot(other) == before, "the other run folder changed"
    assert line == f"report: {held / REPORT_FILE}"
    page = (held / REPORT_FILE).read_text()
    assert str(run) in page and "6 unique items" in page
    engine_gone(held)
