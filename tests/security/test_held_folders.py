"""Folders held once: checked with their parents, then used through the descriptor, never by name.

A run folder checked once and then used by path can be renamed away and replaced by a symlink to
any folder of root's, by whoever can write in its parent. These tests make that attack and its
relatives as ``nobody`` against root's harvest (a parent ``nobody`` owns, a 0777 parent without the
sticky bit, an ``export -o`` folder, a state dir, tune and compare folders) and check the victims
afterwards: their bytes, modes and mtimes, and the processes a record names. Where the parents'
rule leaves another user no way to make the swap, the test makes it as root to show that the held
descriptor alone keeps the run on its own folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from harvest.dataset import Item, Message
from harvest.ledger import Completion, Ledger
from harvest.server.state import LaunchRecord, RunState, RunStatus, state_to_dict
from tests import engines, harvest_process
from tests.realparts import require
from tests.security.attack import AS_NOBODY, data_file

CHAT_ENGINE = Path(__file__).resolve().parents[1] / "quality" / "chat_engine.py"

require("second-user", "the attacks are made as another local user, nobody, against root's harvest")

NOBODY = 65534


def as_nobody(script: str) -> None:
    done = subprocess.run([*AS_NOBODY, "sh", "-c", script], check=False, capture_output=True, text=True,
                          timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr


@contextlib.contextmanager
def nobody_loop(script: str, seconds: float) -> Iterator[subprocess.Popen[str]]:
    """``script`` run as nobody in the background, for at most ``seconds``; ended (its own group, by
    the pid recorded here) when the block ends."""
    proc = subprocess.Popen([*AS_NOBODY, "timeout", str(seconds), "sh", "-c", script], cwd="/",
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the group this test started, by its recorded pid
        proc.wait(10)


def harvest(env: dict[str, str], *args: str, timeout: float = 120,
            umask: int = 0o022) -> subprocess.CompletedProcess[str]:
    return harvest_process.run([sys.executable, "-m", "harvest", *args], check=False, capture_output=True, text=True,
                               timeout=timeout, env=env, stdin=subprocess.DEVNULL, umask=umask)


def start_harvest(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return harvest_process.popen([sys.executable, "-m", "harvest", *args], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env, stdin=subprocess.DEVNULL)


@pytest.fixture
def env(tmp_path):
    return {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}


@pytest.fixture
def shared(request):
    """A folder of root's that every user may write in: 1777 (like /tmp) or, with
    ``indirect=True`` and the param 0o777, without the sticky bit."""
    base = Path(tempfile.mkdtemp(prefix="harvest-shared-", dir="/tmp"))
    os.chmod(base, getattr(request, "param", 0o1777))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def snap(top: Path) -> dict[str, tuple[str, bytes, int, int]]:
    """Everything under ``top`` (itself included): kind, bytes, mode and mtime, nothing followed."""
    out = {}
    for p in [top, *sorted(top.rglob("*"))]:
        st = p.lstat()
        kind = "link" if stat.S_ISLNK(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else "file"
        data = p.read_bytes() if kind == "file" else os.readlink(p).encode() if kind == "link" else b""
        out[str(p)] = (kind, data, stat.S_IMODE(st.st_mode), st.st_mtime_ns)
    return out


def alive(pid: int, create_time: float) -> bool:
    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - create_time) < 0.05 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def end(pid: int, create_time: float) -> None:
    """SIGKILL what this test started, verified by its (pid, create time)."""
    with contextlib.suppress(psutil.Error):
        p = psutil.Process(pid)
        if abs(p.create_time() - create_time) < 0.05:
            p.kill()


def marker_engine(tmp_path: Path) -> tuple[Path, Path]:
    """The stand-in chat engine behind a wrapper that notes each start in a marker file."""
    marker = tmp_path / "engine-started"
    wrapper = tmp_path / "engine.sh"
    wrapper.write_text(f'#!/bin/sh\necho $$ >> "{marker}"\nexec "{sys.executable}" "{CHAT_ENGINE}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, marker


def server_toml(wrapper: Path, *extra: str) -> str:
    argv = [str(wrapper), "--host", "{host}", "--port", "{port}", *extra]
    return (f'[server]\nengine = "command"\nport = {engines.free_port()}\nready_timeout = 30\nstop_grace = 2\n'
            f'stop_deadline = 6\nhealth_url = "http://{{host}}:{{port}}/health"\ncommand = {json.dumps(argv)}\n'
            f'[preflight]\nmin_disk_free_gib = 0.05\n')


def job_toml(path: Path, server: str, data: Path, run_dir: Path, concurrency: int = 2) -> Path:
    path.write_text(server + f'[data]\npath = "{data}"\nid_field = "id"\n[sampling]\nmax_tokens = 4\n'
                    f'[client]\nconcurrency = {concurrency}\n[output]\ndir = "{run_dir}"\n'
                    f'[run]\nprogress_interval = 0.2\n')
    return path


def victim_run(top: Path) -> tuple[Path, subprocess.Popen[bytes], float]:
    """A folder of root's as another run of root's leaves it: progress.json and timeline.json
    (0644), and in ``server/`` the genuine launch record of a live process of root's (a ``sleep`` in
    its own group). Returns the folder, the process and its create time."""
    top.mkdir(mode=0o755)
    (top / "progress.json").write_text('{"state": "root\'s other run"}\n')
    (top / "timeline.json").write_text('{"schema": "root\'s other run"}\n')
    for f in ("progress.json", "timeline.json"):
        os.chmod(top / f, 0o644)
    (top / "server").mkdir(mode=0o700)
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    ct = psutil.Process(proc.pid).create_time()
    port = engines.free_port()
    rec = LaunchRecord(engine="command", pid=proc.pid, pgid=proc.pid, create_time=ct, argv=("sleep", "300"),
                       host="127.0.0.1", port=port, url=f"http://127.0.0.1:{port}", gpus=(), baseline_mib={},
                       engine_version=None, started_at=time.time(), log_path=str(top / "server" / "server.log"),
                       stop_grace=1.0, stop_deadline=5.0)
    (top / "server" / "launch.json").write_text(json.dumps(state_to_dict(RunState(rec, RunStatus.READY))))
    os.chmod(top / "server" / "launch.json", 0o600)
    old = time.time() - 3600  # an hour old: a rewrite shows in the mtime even within a second
    for p in [top, *top.rglob("*")]:
        os.utime(p, (old, old), follow_symlinks=False)
    return top, proc, ct


def own_engine(run_dir: Path) -> tuple[int, float] | None:
    """The (pid, create time) a run's own server record names, if it wrote one."""
    try:
        rec = json.loads((run_dir / "server" / "launch.json").read_text())["record"]
    except (OSError, ValueError, KeyError):
        return None
    return int(rec["pid"]), float(rec["create_time"])


# --- 1. the parent swap ---------------------------------------------------------------------------


@pytest.mark.parametrize("parent_kind", ["owned by nobody", "0777 without the sticky bit"])
def test_a_run_folder_in_a_parent_another_user_can_rename_in_is_refused_at_start(tmp_path, env, parent_kind):
    """nobody waits for root's run to start, renames the run folder away and puts a symlink to
    another run folder of root's in its place (progress.json, timeline.json and a live server's
    record there). The run is refused at once, naming the parent; nothing was launched."""
    box = Path(tempfile.mkdtemp(prefix="harvest-parent-", dir="/tmp"))
    try:
        if parent_kind == "owned by nobody":
            os.chmod(box, 0o1777)
            parent = box / "nobodys"
            as_nobody(f"mkdir -m 755 {parent}")
            why = "is owned by nobody"
        else:
            os.chmod(box, 0o755)
            parent = box / "open"
            parent.mkdir()
            os.chmod(parent, 0o777)
            why = "is writable by group and others without the sticky bit (mode 0777)"
        victim, other, other_ct = victim_run(tmp_path / "victim")
        before = snap(victim)
        wrapper, marker = marker_engine(tmp_path)
        run_dir = parent / "run"
        job = job_toml(tmp_path / "job.toml", server_toml(wrapper, "--delay", "0.2"), data_file(tmp_path, 20),
                       run_dir, concurrency=1)
        swap = (f"i=0; while [ ! -e {run_dir}/ledger.sqlite ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; "
                f"sleep 2; mv {run_dir} {parent}/gone && ln -s {victim} {run_dir}")
        try:
            with nobody_loop(swap, 30):
                done = harvest(env, "run", str(job), "--no-live")
            assert done.returncode == 2 and "Traceback" not in done.stderr, done.stdout + done.stderr
            assert f"{parent}: {why}" in done.stderr, done.stderr
            assert not marker.exists() and not run_dir.exists()  # nothing launched, nothing written
            assert snap(victim) == before and alive(other.pid, other_ct)
        finally:
            for d in (run_dir, parent / "gone"):
                if (mine := own_engine(d)) is not None:
                    end(*mine)
            end(other.pid, other_ct)
            other.wait(10)
    finally:
        shutil.rmtree(box, ignore_errors=True)


def test_a_run_folder_reached_through_another_users_symlink_is_refused_at_start(tmp_path, env):
    """nobody plants ``SHARED/L -> a folder of root's`` in a sticky shared folder, and root's job names
    ``SHARED/L/run``. The folder reached is root's, but nobody can point ``L`` elsewhere between two
    uses (an engine's log, a watcher and an engine's config file are given the run folder by name):
    refused at once, naming the link; nothing launched, nothing written."""
    box = Path(tempfile.mkdtemp(prefix="harvest-link-", dir="/tmp"))
    try:
        os.chmod(box, 0o1777)
        target = tmp_path / "roots"
        target.mkdir(mode=0o700)
        link = box / "L"
        as_nobody(f"ln -s {target} {link}")
        wrapper, marker = marker_engine(tmp_path)
        run_dir = link / "run"
        job = job_toml(tmp_path / "job.toml", server_toml(wrapper), data_file(tmp_path, 4), run_dir)
        for args in (("run", str(job), "--no-live"), ("serve", str(job), "--detach", "--run-dir", str(run_dir))):
            done = harvest(env, *args)
            assert done.returncode == 2 and "Traceback" not in done.stderr, done.stdout + done.stderr
            assert f"{link}: is a symlink owned by nobody (uid {NOBODY})" in done.stderr, done.stderr
            assert not marker.exists() and list(target.iterdir()) == []  # nothing launched, nothing written
    finally:
        shutil.rmtree(box, ignore_errors=True)


def test_a_run_folder_swapped_mid_run_by_a_trusted_hand_changes_nothing_outside(tmp_path, env):
    """The parents' rule leaves no other user a way to rename the run folder (its parent is root's
    0700 folder here), so the swap is made by the test itself, as root, mid-run: the run folder is
    renamed away and a symlink to another run folder of root's takes its name. The run must keep to
    the folder it holds: progress.json and timeline.json, and the stop it makes once it sees the
    swap, which must read its own server's record (its engine stopped), not the live record the link
    points at; it says the folder was replaced and where its own is now."""
    victim, other, other_ct = victim_run(tmp_path / "victim")
    before = snap(victim)
    wrapper, _ = marker_engine(tmp_path)
    box = tmp_path / "box"
    box.mkdir(mode=0o700)
    run_dir, moved = box / "run", box / "moved"
    job = job_toml(tmp_path / "job.toml", server_toml(wrapper, "--delay", "0.25"), data_file(tmp_path, 24),
                   run_dir, concurrency=1)
    proc = start_harvest(env, "run", str(job), "--no-live")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if (run_dir / "progress.json").exists() and (run_dir / "server" / "launch.json").exists():
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.5)
        os.rename(run_dir, moved)
        run_dir.symlink_to(victim)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 1, out + err
        assert f"the run folder was replaced during the run: {run_dir} now names a symlink" in out, out + err
        assert snap(victim) == before  # nothing in the other run's folder changed, its record included
        assert alive(other.pid, other_ct)  # its server was not signalled
        mine = own_engine(moved)
        assert mine is not None and not alive(*mine), out + err  # this run's own engine was stopped
        progress = json.loads((moved / "progress.json").read_text())
        assert progress["state"] == "stopped" and (moved / "timeline.json").is_file(), progress
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
        for d in (moved, victim):
            if d != victim and (mine := own_engine(d)) is not None:
                end(*mine)
        end(other.pid, other_ct)
        other.wait(10)


# --- 2. export -o into a shared folder ------------------------------------------------------------


def _ledger_with_rows(run_dir: Path, n: int) -> None:
    with Ledger.open(run_dir, settings_hash="0" * 32) as ledger:
        ledger.ingest(Item(f"id{i:06d}", "data.jsonl", i + 1, (Message("user", f"question {i} " + "q" * 200),),
                           raw_id=f"id{i:06d}") for i in range(n))
        while rows := ledger.claim(5000):
            ledger.complete([Completion(r.id, {
                "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a" * 300}],
                "turns": [{"finish_reason": "stop", "prompt_tokens": 10, "completion_tokens": 5,
                           "endpoint": "http://127.0.0.1:8000/v1", "latency_s": 0.25, "attempts": 1}],
                "model": "m", "settings_hash": "0" * 32}) for r in rows])


def _race_temp_names(folder: Path, name: str, victim: Path) -> str:
    """nobody's loop: every temporary name beside ``name`` it sees is replaced by a symlink to root's
    ``victim`` (and every name it could guess is planted first)."""
    return (f"cd {folder} || exit 0; while :; do "
            f"for t in .{name}.*.tmp; do [ -e \"$t\" ] || [ -L \"$t\" ] || continue; "
            f"mv -f \"$t\" gone.$$ 2>/dev/null; rm -f \"$t\" 2>/dev/null; ln -s {victim} \"$t\" 2>/dev/null; done; "
            f"last=$(cat /proc/sys/kernel/ns_last_pid 2>/dev/null || echo 0); "
            f"for n in 0 1 2; do ln -s {victim} .{name}.$last.$n.tmp 2>/dev/null; done; done")


@pytest.mark.parametrize("shared", [0o777, 0o1777], indirect=True, ids=["0777", "1777"])
def test_export_into_a_shared_folder_never_touches_root_files(tmp_path, env, shared):
    """nobody races ``harvest export -o SHARED/out.jsonl``, turning every temporary file it can
    into a symlink to a file of root's. A 0777 folder without the sticky bit (where nobody can
    rename root's files) is refused, naming it; in a 1777 folder the export goes through, and the
    result is root's own regular file; root's file is unchanged either way."""
    run_dir = tmp_path / "run"
    _ledger_with_rows(run_dir, 4000)
    victim = tmp_path / "victim.txt"
    victim.write_text("root's own file\n")
    victim.chmod(0o644)
    before = snap(victim)
    out = shared / "out.jsonl"
    with nobody_loop(_race_temp_names(shared, out.name, victim), 30):
        time.sleep(0.3)
        done = harvest(env, "export", str(run_dir), "--format", "sharegpt", "--output", str(out))
    assert "Traceback" not in done.stderr, done.stderr
    assert snap(victim) == before
    if stat.S_IMODE(shared.stat().st_mode) == 0o777:
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"{shared}: is writable by group and others without the sticky bit" in done.stderr, done.stderr
        assert not out.exists() and not out.is_symlink()
    else:
        assert done.returncode == 0, done.stdout + done.stderr
        st = out.lstat()
        assert stat.S_ISREG(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600
        assert len(out.read_text().splitlines()) == 4000


# --- 3. a hard-linked log ---------------------------------------------------------------------------


def test_a_hard_linked_server_log_is_refused_before_it_is_truncated(tmp_path, env):
    """``server.log`` in root's own run folder is a second name of another file of root's (24 bytes):
    refused, naming the file, and the file keeps its bytes; no engine was started."""
    victim = tmp_path / "victim.log"
    victim.write_bytes(b"24 bytes of root's log\n!")
    assert victim.stat().st_size == 24
    served = tmp_path / "served"
    served.mkdir(mode=0o700)
    os.link(victim, served / "server.log")
    before = snap(victim)
    wrapper, marker = marker_engine(tmp_path)
    cfg = tmp_path / "serve.toml"
    cfg.write_text(server_toml(wrapper))
    done = harvest(env, "serve", str(cfg), "--run-dir", str(served), "--detach")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert f"{served / 'server.log'}: has 2 hard links" in done.stderr, done.stderr
    assert snap(victim) == before and victim.stat().st_size == 24
    assert not marker.exists() and not (served / "launch.json").exists()


# --- 4. report -o under umask 0 ---------------------------------------------------------------------


def test_report_output_folders_are_made_0700_whatever_the_umask(tmp_path, env):
    run_dir = tmp_path / "run"
    _ledger_with_rows(run_dir, 3)
    out = tmp_path / "NEW" / "x" / "report.html"
    done = harvest(env, "report", str(run_dir), "--output", str(out), umask=0)
    assert done.returncode == 0, done.stdout + done.stderr
    modes = {p.name: stat.S_IMODE(p.lstat().st_mode) for p in (out.parent.parent, out.parent, out)}
    assert modes == {"NEW": 0o700, "x": 0o700, "report.html": 0o600}, modes


# --- 5. refusals before any launch ------------------------------------------------------------------


def _nobodys_folder(shared: Path, name: str) -> Path:
    folder = shared / name
    as_nobody(f"mkdir -m 700 {folder}")
    return folder


def test_tune_compare_and_a_foreign_state_dir_are_refused_before_any_launch(tmp_path, env, shared):
    wrapper, marker = marker_engine(tmp_path)
    data = data_file(tmp_path, 6)
    common = f'[data]\npath = "{data}"\nid_field = "id"\n[sampling]\nmax_tokens = 4\n[client]\nconcurrency = 2\n'
    grid = tmp_path / "grid.toml"
    grid.write_text('[grid]\nextra_args = [["--delay", "0.01"]]\n[probe]\nprompts = 4\nmax_tokens = 4\n'
                    '[throughput]\nprompts = 4\nconcurrency = 2\n')
    tune_job = tmp_path / "tune.toml"
    tune_job.write_text(server_toml(wrapper) + common + f'[output]\ndir = "{tmp_path / "tuned"}"\n')
    ref, cand = tmp_path / "ref.toml", tmp_path / "cand.toml"
    ref.write_text(server_toml(wrapper) + common)
    cand.write_text(server_toml(wrapper, "--perturb", "0.5") + common)
    run_dir = tmp_path / "run"
    run_job = job_toml(tmp_path / "job.toml", server_toml(wrapper), data, run_dir)

    tune_out, compare_out = _nobodys_folder(shared, "tune"), _nobodys_folder(shared, "compare")
    state = _nobodys_folder(shared, "state")
    foreign = {**env, "HARVEST_STATE_DIR": str(state)}
    cases = [
        (harvest(env, "tune", str(tune_job), "--grid", str(grid), "--out", str(tune_out)), tune_out),
        (harvest(env, "compare", "--reference", str(ref), "--candidate", str(cand), "--probe", "4",
                 "--out", str(compare_out)), compare_out),
        (harvest(foreign, "run", str(run_job), "--no-live"), state),
        (harvest(foreign, "serve", str(tmp_path / "ref.toml"), "--run-dir", str(tmp_path / "served"), "--detach"),
         state),
    ]
    for done, folder in cases:
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.args[3:] + [done.stdout, done.stderr]
        assert f"{folder}: is owned by nobody" in done.stderr, done.stderr
    assert not marker.exists()  # no engine was started by any of them
    for folder in (tune_out, compare_out, state):
        assert list(folder.iterdir()) == [], folder  # nothing written in the refused folders
    assert not run_dir.exists() and not (tmp_path / "served").exists() and not (tmp_path / "tuned").exists()


# --- 6. the race, for 30 s ----------------------------------------------------------------------------


@pytest.fixture
def open_shared():
    """A folder of root's that every user may write in, without the sticky bit (0777)."""
    base = Path(tempfile.mkdtemp(prefix="harvest-open-", dir="/tmp"))
    os.chmod(base, 0o777)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
def test_runs_beside_thirty_seconds_of_renames_and_links_change_nothing_outside(tmp_path, env, shared,
                                                                                open_shared):
    """For 30 s nobody tries every rename and symlink it can in two shared folders of root's while
    root runs a campaign in each: in a 1777 folder (the parents' rule accepts it: nobody cannot
    rename root's entries there) the run goes on to the end; in a 0777 one (where nobody swaps the
    run folder for a link to another run of root's as soon as it holds a ledger) the run is refused
    at start. Beside them, where the parents' rule leaves nobody a way in, the test itself swaps a
    third run's folder for a link to the victim and back as fast as it can for the same 30 s, as
    root, from the moment that run holds its folder: every swap lands, and the run still writes only
    in the folder it holds (and stops, saying so, when it sees its folder's name lead elsewhere; it
    looks once a second, so it may also see only its own folder and finish). Nothing outside the run folders changes, the live server another record
    names is not signalled, and each run's own engine is stopped."""
    victim, other, other_ct = victim_run(tmp_path / "victim")
    before = snap(victim)
    wrapper, _ = marker_engine(tmp_path)
    run_dir, open_dir = shared / "run", open_shared / "run"
    run_dir.mkdir(mode=0o700)  # root's, made before nobody starts (a link planted first is refused)
    job = job_toml(tmp_path / "job.toml", server_toml(wrapper, "--delay", "0.25"), data_file(tmp_path, 100),
                   run_dir, concurrency=1)
    (tmp_path / "open").mkdir()
    open_job = job_toml(tmp_path / "open" / "job.toml", server_toml(wrapper, "--delay", "0.25"),
                        data_file(tmp_path / "open", 60), open_dir, concurrency=1)
    loop = (f"i=0; while :; do i=$((i+1)); cd {shared}; "
            f"mv -f run gone 2>/dev/null; mv -f run/server gone-server 2>/dev/null; rm -rf run 2>/dev/null; "
            f"ln -s {victim} run 2>/dev/null; ln -s {victim}/server run/server 2>/dev/null; "
            f"for f in progress.json timeline.json ledger.lock ledger.sqlite-wal; do "
            f"ln -s {victim}/$f run/$f 2>/dev/null; ln -sf {victim}/$f run/.$f.$$.0.tmp 2>/dev/null; done; "
            f"mkdir -m 777 decoy 2>/dev/null; ln -sfn {victim} decoy/run 2>/dev/null; mv -f decoy run 2>/dev/null; "
            f"cd {open_shared}; if [ -e run/ledger.sqlite ] && [ ! -L run ]; then "
            f"mv run gone.$i 2>/dev/null && ln -s {victim} run; fi; "
            f"done")
    (tmp_path / "own").mkdir()
    box = tmp_path / "box"
    box.mkdir(mode=0o700)
    own_dir, moved = box / "run", box / "moved"
    own_job = job_toml(tmp_path / "own" / "job.toml", server_toml(wrapper, "--delay", "0.25"),
                       data_file(tmp_path / "own", 100), own_dir, concurrency=1)
    swaps = [0]
    stop_swapping = threading.Event()

    def swap_for(seconds: float) -> None:
        """Root's tight loop: the run folder's name leads to the victim, then back, until told."""
        end_at = time.monotonic() + seconds
        while time.monotonic() < end_at and not stop_swapping.is_set():
            if (own_dir / "server" / "launch.json").exists():
                break  # the run holds its folder and its server is recorded
            time.sleep(0.02)
        while time.monotonic() < end_at and not stop_swapping.is_set():
            os.rename(own_dir, moved)
            own_dir.symlink_to(victim)
            swaps[0] += 1
            time.sleep(0.003)
            own_dir.unlink()
            os.rename(moved, own_dir)
            time.sleep(0.003)

    t0 = time.monotonic()
    procs: list[subprocess.Popen[str]] = []
    swapper = threading.Thread(target=swap_for, args=(30,), daemon=True)
    try:
        with nobody_loop(loop, 30) as looping:
            procs = [start_harvest(env, "run", str(job), "--no-live"),
                     start_harvest(env, "run", str(open_job), "--no-live"),
                     start_harvest(env, "run", str(own_job), "--no-live")]
            swapper.start()
            outs = [p.communicate(timeout=120) for p in procs]
            stop_swapping.set()
            swapper.join(10)
            looping.wait(max(1.0, 40 - (time.monotonic() - t0)))
        (out, err), (open_out, open_err), (own_out, own_err) = outs
        assert procs[0].returncode == 0, out + err
        assert procs[1].returncode == 2, open_out + open_err
        assert f"{open_shared}: is writable by group and others without the sticky bit" in open_err, open_err
        caught = "the run folder was replaced during the run" in own_out
        assert procs[2].returncode == (1 if caught else 0), own_out + own_err
        assert swaps[0] > 100, swaps  # the swaps landed, beside the run, many times over
        assert snap(victim) == before and alive(other.pid, other_ct)
        for d in (run_dir, own_dir):
            mine = own_engine(d)
            assert mine is not None and not alive(*mine), d
        assert json.loads((own_dir / "progress.json").read_text())["state"] == ("stopped" if caught else "finished")
        owners = {p.lstat().st_uid for p in [run_dir, *run_dir.rglob("*")]}
        assert owners == {0}, owners  # nothing of nobody's got into the run folder
    finally:
        stop_swapping.set()
        if swapper.is_alive():
            swapper.join(10)
        if own_dir.is_symlink():
            own_dir.unlink()
        if moved.exists() and not own_dir.exists():
            os.rename(moved, own_dir)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate(timeout=30)
        for d in (run_dir, own_dir, *open_shared.glob("gone.*")):
            if not d.is_symlink() and (mine := own_engine(d)) is not None:
                end(*mine)
        end(other.pid, other_ct)
        other.wait(10)
