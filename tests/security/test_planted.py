"""Run folders nobody else can plant in, and signals only to groups a record proves ours.

Each attack is made by a second, unprivileged user (``nobody``, through ``setpriv``) against
harvest running as root, as on a shared GPU box: symlinks planted in a world-writable folder
(the lock, the ledger, the server log, the launch record), a ``launch.json`` forged to name a
process of root's, and a ``sleep`` of its own sitting in a process group whose number a stale
launch record names. Every refusal must name the path, and nothing outside the folder may change.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from harvest.errors import UnsafePathError
from harvest.ledger.store import Ledger
from harvest.server.state import LaunchRecord, RunState, RunStatus, state_to_dict
from tests import engines, harvest_process
from tests.realparts import require
from tests.security.attack import AS_NOBODY, data_file

CHAT_ENGINE = Path(__file__).resolve().parents[1] / "quality" / "chat_engine.py"


require("second-user", "the attacks are made as another local user, nobody, against root's harvest")



def as_nobody(script: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*AS_NOBODY, "sh", "-c", script], input=stdin, capture_output=True, text=True,
                          timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr
    return done


def harvest(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return harvest_process.run([sys.executable, "-m", "harvest", *args], capture_output=True, text=True,
                               timeout=timeout, env=env, stdin=subprocess.DEVNULL)


@pytest.fixture
def shared_tmp():
    """A folder anyone may write in, like /tmp (1777), outside the test's private tmp_path."""
    base = Path(tempfile.mkdtemp(prefix="harvest-shared-", dir="/tmp"))
    os.chmod(base, 0o1777)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def env(tmp_path):
    return {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}


def snapshot(paths: list[Path]) -> dict[str, tuple[bool, bytes, int]]:
    out = {}
    for p in paths:
        if p.exists():
            st = p.stat()
            out[str(p)] = (True, p.read_bytes(), st.st_mtime_ns)
        else:
            out[str(p)] = (False, b"", 0)
    return out


def write_job(path: Path, run_dir: Path, data: Path, server: str = "") -> Path:
    path.write_text(server + f'[data]\npath = "{data}"\nid_field = "id"\n[sampling]\nmax_tokens = 4\n'
                    f'[client]\nconcurrency = 2\nendpoints = ["http://127.0.0.1:9"]\nhealth_deadline = 2\n'
                    f'[output]\ndir = "{run_dir}"\n')
    return path


def test_symlinks_planted_by_another_user_are_refused_and_nothing_outside_changes(tmp_path, shared_tmp, env):
    victim, victim_db, victim_log = tmp_path / "victim_root.txt", tmp_path / "victim_root_new.db", tmp_path / "log.txt"
    victim.write_text("root's own file\n")
    victim_log.write_text("root's log\n")
    evil = shared_tmp / "evilrun"
    as_nobody(f"mkdir -m 777 {evil} && ln -s {victim} {evil}/ledger.lock && ln -s {victim_db} {evil}/ledger.sqlite"
              f" && mkdir -m 777 {evil}/server && ln -s {victim_log} {evil}/server/server.log"
              f" && ln -s {victim} {evil}/server/launch.json && ln -s {victim} {evil}/progress.json")
    before = snapshot([victim, victim_db, victim_log])
    data = data_file(tmp_path)

    run = harvest(env, "run", str(write_job(tmp_path / "job.toml", evil, data)), "--no-live")
    serve_cfg = tmp_path / "serve.toml"
    serve_cfg.write_text(f'[server]\nengine = "llamacpp"\nmodel = "{tmp_path / "m.gguf"}"\nport = '
                         f'{engines.free_port()}\n')
    serve = harvest(env, "serve", str(serve_cfg), "--run-dir", str(evil / "server"))
    stop = harvest(env, "stop", str(evil / "server"))

    for done, code in ((run, 2), (serve, 2), (stop, 2)):
        assert done.returncode == code, done.args[3:] + [done.stdout, done.stderr]
        assert "Traceback" not in done.stderr, done.stderr
    assert f"{evil}: is owned by nobody" in run.stderr, run.stderr
    assert f"{evil / 'server'}: is owned by nobody" in serve.stderr, serve.stderr
    assert f"{evil / 'server'}: is owned by nobody" in stop.stderr, stop.stderr
    assert snapshot([victim, victim_db, victim_log]) == before  # nothing outside the folder changed
    assert not victim_db.exists()
    assert oct(evil.stat().st_mode & 0o7777) == oct(0o777)  # and the folder was not chmod-ed either
    assert sorted(p.name for p in evil.iterdir()) == ["ledger.lock", "ledger.sqlite", "progress.json", "server"]


def test_a_world_writable_folder_of_root_is_refused_and_left_as_it_is(tmp_path, shared_tmp, env):
    """Like --run-dir /tmp: root's own folder, but every user writes in it (1777)."""
    victim = tmp_path / "victim_root.txt"
    victim.write_text("root's own file\n")
    as_nobody(f"ln -s {victim} {shared_tmp}/ledger.lock && ln -s {victim} {shared_tmp}/server.log")
    before = snapshot([victim])
    run = harvest(env, "run", str(write_job(tmp_path / "job.toml", shared_tmp, data_file(tmp_path))), "--no-live")
    serve_cfg = tmp_path / "serve.toml"
    serve_cfg.write_text(f'[server]\nengine = "llamacpp"\nmodel = "{tmp_path / "m.gguf"}"\nport = '
                         f'{engines.free_port()}\n')
    serve = harvest(env, "serve", str(serve_cfg), "--run-dir", str(shared_tmp), "--detach")
    for done in (run, serve):
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stdout + done.stderr
        assert f"{shared_tmp}: is writable by group and others (mode 1777)" in done.stderr, done.stderr
    assert oct(shared_tmp.stat().st_mode & 0o7777) == oct(0o1777)  # never chmod-ed
    assert snapshot([victim]) == before


def test_links_and_foreign_files_inside_an_own_folder_are_refused_by_path(tmp_path):
    """The second layer: a folder of root's own (0700) that still holds a link or a file of another
    user (left from when it was open, or restored from elsewhere): each is named, none followed."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    other_run = tmp_path / "other"
    Ledger.open(other_run, settings_hash="h-other").close()
    for name, plant in (("ledger.lock", lambda d: (d / "ledger.lock").symlink_to(victim)),
                        ("ledger.sqlite", lambda d: (d / "ledger.sqlite").symlink_to(other_run / "ledger.sqlite")),
                        ("ledger.sqlite-wal", lambda d: (d / "ledger.sqlite-wal").symlink_to(victim)),
                        ("ledger.sqlite", lambda d: ((d / "ledger.sqlite").write_bytes(b""),
                                                     os.chown(d / "ledger.sqlite", 65534, 65534)))):
        run_dir = tmp_path / f"run-{name}-{len(list(tmp_path.iterdir()))}"
        run_dir.mkdir(mode=0o700)
        plant(run_dir)
        with pytest.raises(UnsafePathError) as exc:
            Ledger.open(run_dir, settings_hash="h")
        assert str(exc.value).startswith(f"{run_dir / name}: "), str(exc.value)
    assert victim.read_text() == "keep\n"
    other = Ledger.open_readonly(other_run)
    try:
        assert other.meta()["settings_hash"] == "h-other"  # the other run was not "resumed"
    finally:
        other.close()


def _record(pid: int, create_time: float, run_dir: Path, port: int) -> dict:
    rec = LaunchRecord(engine="llamacpp", pid=pid, pgid=pid, create_time=create_time, argv=("llama-server",),
                       host="127.0.0.1", port=port, url=f"http://127.0.0.1:{port}", gpus=(), baseline_mib={},
                       engine_version=None, started_at=time.time(), log_path=str(run_dir / "server.log"),
                       stop_grace=1.0, stop_deadline=5.0)
    return state_to_dict(RunState(record=rec, status=RunStatus.READY))


def _alive(pid: int, create_time: float) -> bool:
    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - create_time) < 0.05 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_a_launch_record_forged_by_another_user_signals_nothing(tmp_path, shared_tmp, env):
    root_proc = subprocess.Popen(["sleep", "300"], start_new_session=True)  # root's own, this test's
    try:
        ct = psutil.Process(root_proc.pid).create_time()
        forged = shared_tmp / "forged"
        doc = json.dumps(_record(root_proc.pid, ct, forged, engines.free_port()))
        as_nobody(f"mkdir -m 700 {forged} && cat > {forged}/launch.json", stdin=doc)
        # The same forgery inside a folder of root's: a record file another user owns.
        own = tmp_path / "own"
        own.mkdir(mode=0o700)
        (own / "launch.json").write_text(json.dumps(_record(root_proc.pid, ct, own, engines.free_port())))
        os.chown(own / "launch.json", 65534, 65534)

        first, second = harvest(env, "stop", str(forged)), harvest(env, "stop", str(own))

        assert first.returncode == 2 and f"{forged}: is owned by nobody" in first.stderr, first.stderr
        assert second.returncode == 2 and f"{own / 'launch.json'}: is owned by nobody" in second.stderr, \
            second.stderr
        assert _alive(root_proc.pid, ct)  # root's process was not signalled
    finally:
        root_proc.kill()
        root_proc.wait(10)


def _reused_group() -> tuple[int, int, float]:
    """As nobody, a double-forking process: it makes its own session and group (number X), leaves a
    ``sleep`` in them and exits. Returns X, the sleep's pid and its create time."""
    code = ("import os\nos.setsid()\npid = os.fork()\nif pid == 0:\n"
            "    null = os.open(os.devnull, os.O_RDWR)\n"
            "    for fd in (0, 1, 2):\n        os.dup2(null, fd)\n"
            "    os.execvp('sleep', ['sleep', '300'])\nprint(os.getpid(), pid, flush=True)\n")
    done = subprocess.run([*AS_NOBODY, sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd="/")
    assert done.returncode == 0, done.stderr
    group, sleeper = map(int, done.stdout.split())
    end = time.monotonic() + 10
    while psutil.pid_exists(group) and time.monotonic() < end:  # the forker is reaped by now (run waited)
        time.sleep(0.05)
    assert not psutil.pid_exists(group) and os.getpgid(sleeper) == group
    return group, sleeper, psutil.Process(sleeper).create_time()


def _end_sleeper(pid: int, create_time: float) -> None:
    with contextlib.suppress(psutil.Error):
        p = psutil.Process(pid)
        if abs(p.create_time() - create_time) < 0.05:  # the sleep this test made, verified
            p.send_signal(signal.SIGKILL)


def test_a_sleep_in_a_reused_group_survives_stop_and_resume(tmp_path, env):
    """A stale record names pid and group X (its leader long gone). X now is the group of a
    double-forked ``sleep`` of another user, created after the recorded leader: exactly what the
    old rule ("members created after the leader") took for ours. Neither ``harvest stop`` nor the
    automatic leftover stop of a resume may signal it; the resume says what it found."""
    port = engines.free_port()
    data = data_file(tmp_path, 3)
    run_dir = tmp_path / "run"
    server = (f'[server]\nengine = "command"\nport = {port}\nready_timeout = 30\nstop_grace = 2\n'
              f'stop_deadline = 6\nhealth_url = "http://{{host}}:{{port}}/health"\n'
              f'command = ["{sys.executable}", "{CHAT_ENGINE}", "--host", "{{host}}", "--port", "{{port}}"]\n'
              f'[preflight]\nmin_disk_free_gib = 0.05\n')
    job = tmp_path / "job.toml"
    job.write_text(server + f'[data]\npath = "{data}"\nid_field = "id"\n[sampling]\nmax_tokens = 4\n'
                   f'[output]\ndir = "{run_dir}"\n')
    first = harvest(env, "run", str(job), "--no-live")
    assert first.returncode == 0, first.stdout + first.stderr

    group, sleeper, sleeper_ct = _reused_group()
    try:
        stale = tmp_path / "stale"
        stale.mkdir(mode=0o700)
        doc = _record(group, sleeper_ct - 30.0, stale, engines.free_port())  # the leader predates the sleep
        (stale / "launch.json").write_text(json.dumps(doc))
        os.chmod(stale / "launch.json", 0o600)
        stop = harvest(env, "stop", str(stale))
        assert _alive(sleeper, sleeper_ct), stop.stdout + stop.stderr
        assert "not sent: no recorded process alive" in stop.stdout + stop.stderr, stop.stdout + stop.stderr
        assert f"{sleeper} (sleep)" in stop.stdout + stop.stderr  # what it found, named

        # The same stale record as the run's server record: the resume's leftover stop.
        server_record = json.loads((run_dir / "server" / "launch.json").read_text())
        server_record["record"].update(pid=group, pgid=group, create_time=sleeper_ct - 30.0)
        server_record.update(status="ready", descendants=[], watcher=None)
        (run_dir / "server" / "launch.json").write_text(json.dumps(server_record))
        resume = harvest(env, "run", str(job), "--no-live")
        assert resume.returncode == 0, resume.stdout + resume.stderr
        assert _alive(sleeper, sleeper_ct)
        out = resume.stdout + resume.stderr
        assert "names no process still running" in out and "nothing was signalled" in out, out
        assert f"{sleeper} (sleep)" in out, out
    finally:
        _end_sleeper(sleeper, sleeper_ct)


def test_status_and_export_do_not_follow_a_linked_ledger(tmp_path, shared_tmp, env):
    """Read-only commands may read another user's run, but never through a link planted in it."""
    real = tmp_path / "real"
    Ledger.open(real, settings_hash="h").close()
    evil = shared_tmp / "evilrun"
    as_nobody(f"mkdir -m 755 {evil} && ln -s {real / 'ledger.sqlite'} {evil}/ledger.sqlite")
    for args in (("status", str(evil)), ("export", str(evil), "--format", "sharegpt", "--output",
                                         str(tmp_path / "out.jsonl"))):
        done = harvest(env, *args)
        assert done.returncode == 2 and f"{evil / 'ledger.sqlite'}: is a symlink" in done.stderr, \
            done.stdout + done.stderr
    assert not (tmp_path / "out.jsonl").exists()
