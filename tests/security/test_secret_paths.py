"""Each path a secret can take besides ``api_key_env``, followed to every place harvest shows it.

The paths: a key pasted into ``extra_args`` or ``command`` (refused at load, with the way to pass
it), ``--host``/``--port`` in ``extra_args`` (refused: the loopback rule lives in [server]), a
password in ``base_url`` and in ``[client] endpoints``, a token in ``[cluster] runtime_env``, and
an engine that echoes its argv and environment into the log harvest shows on a failed start.
For each, the secret must be in no file under the run folder and the state dir, in no export,
report, ``status --json`` or console output, and in no ``/proc/PID/cmdline`` another user reads.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harvest.net import port_listening
from tests import engines, harvest_process
from tests.realparts import require
from tests.security.attack import data_file

CHAT_ENGINE = Path(__file__).resolve().parents[1] / "quality" / "chat_engine.py"


def harvest(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return harvest_process.run([sys.executable, "-m", "harvest", *args], capture_output=True, text=True,
                               timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def other_users_cmdlines() -> str:
    """Every /proc/PID/cmdline as user nobody reads it."""
    require("second-user", "another local user must not see the secret in any process's command line")
    done = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "sh", "-c",
                           'for f in /proc/[0-9]*/cmdline; do cat "$f" 2>/dev/null; echo; done'],
                          capture_output=True, timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr
    return done.stdout.decode("utf-8", "replace")


def assert_nowhere(secret: str, roots: list[Path], outputs: list[subprocess.CompletedProcess[str]],
                   skip: tuple[Path, ...] = ()) -> int:
    """The secret is in no file under ``roots`` (but ``skip``), no output, no other user's cmdline
    view. Returns how many files were read."""
    files = [p for r in roots if r.exists() for p in ([r] if r.is_file() else r.rglob("*"))
             if p.is_file() and p not in skip]
    holding = [str(p) for p in files if secret.encode() in p.read_bytes()]
    assert holding == [], holding
    for out in outputs:
        assert secret not in out.stdout and secret not in out.stderr, out.args
    assert secret not in other_users_cmdlines()
    return len(files)


@pytest.fixture
def env(tmp_path):
    return {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}


@pytest.mark.parametrize(("line", "shown"), [
    ('extra_args = ["-c", "4096", "--api-key", "{s}"]', "`extra_args` holds --api-key"),
    ('extra_args = ["--hf-token={s}"]', "`extra_args` holds --hf-token"),
    ('extra_args = ["--host", "0.0.0.0", "--x", "{s}"]', "`extra_args` holds --host: set [server] host"),
    ('extra_args = ["--port={s}"]', "`extra_args` holds --port: set [server] port"),
    ('engine = "command"\ncommand = ["{py}", "srv.py", "--token", "{s}"]\nhealth_url = "http://{{host}}:{{port}}/h"',
     "`command` holds --token"),
])
def test_a_secret_or_a_bind_in_argv_is_refused_at_load_and_never_reaches_anything(tmp_path, env, line, shown):
    secret = "sv-" + secrets.token_hex(10)
    run_dir = tmp_path / "run"
    server = line.format(s=secret, py=sys.executable)
    engine = "" if "engine" in server else 'engine = "llamacpp"\nmodel = "m.gguf"\n'
    job = tmp_path / "job.toml"
    job.write_text(f"[server]\n{engine}{server}\n[data]\npath = \"{data_file(tmp_path, 6)}\"\n"
                   f"[output]\ndir = \"{run_dir}\"\n")
    outputs = [harvest(env, "run", str(job), "--no-live"), harvest(env, "serve", str(job), "--detach"),
               harvest(env, "preflight", str(job))]
    for done in outputs:
        assert done.returncode == 2, done.args[3:] + [done.stdout, done.stderr]
        assert shown in done.stderr and "Traceback" not in done.stderr, done.stderr
    if "--host" not in shown and "--port" not in shown:
        assert "api_key_env" in outputs[0].stderr and "[server.env]" in outputs[0].stderr
    assert not run_dir.exists() and not (tmp_path / "state").exists()  # refused before anything was made
    assert_nowhere(secret, [tmp_path], outputs, skip=(job,))


def test_url_passwords_are_redacted_in_every_record_page_and_console_line(tmp_path, env):
    pw1, pw2 = "pw1-" + secrets.token_hex(10), "pw2-" + secrets.token_hex(10)
    port = engines.free_port()
    engine = subprocess.Popen([sys.executable, str(CHAT_ENGINE), "--host", "127.0.0.1", "--port", str(port),
                               "--life", "300"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        end = time.monotonic() + 30
        while time.monotonic() < end and not port_listening("127.0.0.1", port, timeout=0.5):
            time.sleep(0.1)
        run_dir = tmp_path / "run"
        job = tmp_path / "job.toml"
        job.write_text(f'[server]\nengine = "openai"\nbase_url = "http://harv:{pw1}@127.0.0.1:{port}/v1"\n'
                       f'[client]\nconcurrency = 2\nendpoints = ["http://harv:{pw2}@localhost:{port}/v1"]\n'
                       f'[data]\npath = "{data_file(tmp_path, 6)}"\nid_field = "id"\n[sampling]\nmax_tokens = 4\n'
                       f'[output]\ndir = "{run_dir}"\n[run]\nprogress_interval = 0.2\n')
        outputs = [run := harvest(env, "run", str(job), "--no-live")]
        assert run.returncode == 0, run.stdout + run.stderr
        outputs.append(status := harvest(env, "status", str(run_dir), "--json"))
        assert status.returncode == 0 and json.loads(status.stdout)["totals"]["settled"] == 6, status.stdout
        outputs.append(harvest(env, "export", str(run_dir), "--format", "sharegpt", "--status", "done,truncated"))
        outputs.append(harvest(env, "report", str(run_dir)))
        assert all(o.returncode == 0 for o in outputs), [(o.args[3:], o.stderr) for o in outputs]
        assert {"export.sharegpt.jsonl", "report.html", "timeline.json", "progress.json"} <= \
            {p.name for p in run_dir.iterdir()}
        # Where the URLs were, they stay readable with the password hidden.
        conn = sqlite3.connect(f"file:{run_dir / 'ledger.sqlite'}?mode=ro", uri=True)
        job_meta = json.loads(conn.execute("SELECT value FROM meta WHERE key = 'job'").fetchone()[0])
        conn.close()
        assert job_meta["server"]["base_url"] == f"http://***@127.0.0.1:{port}/v1", job_meta["server"]
        assert job_meta["client"]["endpoints"] == [f"http://***@localhost:{port}/v1"]
        for pw in (pw1, pw2):
            assert assert_nowhere(pw, [run_dir, tmp_path / "state"], outputs) >= 6
    finally:
        engine.kill()
        engine.wait(10)


def test_a_runtime_env_token_is_redacted_in_the_ledger_and_the_console(tmp_path, env):
    token = "hf_" + secrets.token_hex(12)
    run_dir = tmp_path / "run"
    job = tmp_path / "job.toml"
    job.write_text(f'[server]\nengine = "llamacpp"\nmodel = "m.gguf"\n[cluster]\naddress = "127.0.0.1:1"\n'
                   f'connect_timeout = 3\nruntime_env = {{env_vars = {{HF_TOKEN = "{token}", OMP_NUM_THREADS = "1"}}}}\n'
                   f'[data]\npath = "{data_file(tmp_path, 6)}"\n[output]\ndir = "{run_dir}"\n')
    outputs = [run := harvest(env, "run", str(job), "--no-live")]
    assert run.returncode == 2 and "cannot connect to Ray at 127.0.0.1:1" in run.stderr, run.stdout + run.stderr
    outputs.append(status := harvest(env, "status", str(run_dir), "--json"))
    assert status.returncode == 0, status.stderr
    conn = sqlite3.connect(f"file:{run_dir / 'ledger.sqlite'}?mode=ro", uri=True)
    job_meta = json.loads(conn.execute("SELECT value FROM meta WHERE key = 'job'").fetchone()[0])
    conn.close()
    assert job_meta["cluster"]["runtime_env"]["env_vars"] == {"HF_TOKEN": "***", "OMP_NUM_THREADS": "1"}
    assert assert_nowhere(token, [run_dir, tmp_path / "state"], outputs) >= 2


ECHO_ENGINE = '''
import os, sys
print("argv:", sys.argv, flush=True)
print("env: HF_TOKEN=" + os.environ.get("HF_TOKEN", "") + " api_key=" + os.environ.get("ECHO_KEY", ""), flush=True)
print("config: {'hf_token': '" + os.environ.get("HF_TOKEN", "") + "', 'api_key': '" + os.environ.get("ECHO_KEY", "")
      + "'}", flush=True)
print("\\x1b[2J\\x1b]0;owned\\x07 engine title", flush=True)
print("Traceback (most recent call last):", flush=True)
print("RuntimeError: cannot start with token " + os.environ.get("HF_TOKEN", ""), flush=True)
sys.exit(1)
'''


def test_an_engine_echoing_its_argv_and_environment_is_redacted_where_harvest_shows_it(tmp_path, env):
    hf, key = "hf_" + secrets.token_hex(12), "sk-" + secrets.token_hex(12)
    script = tmp_path / "echo_engine.py"
    script.write_text(ECHO_ENGINE)
    run_dir = tmp_path / "served"
    cfg = tmp_path / "serve.toml"
    cfg.write_text(f'[server]\nengine = "command"\nport = {engines.free_port()}\napi_key_env = "ECHO_KEY"\n'
                   f'command = ["{sys.executable}", "{script}", "--port", "{{port}}", "-c", "4096"]\n'
                   f'health_url = "http://{{host}}:{{port}}/health"\nready_timeout = 30\n'
                   f'[server.env]\nHF_TOKEN = "{hf}"\n[preflight]\nmin_disk_free_gib = 0.05\n')
    outputs = [serve := harvest({**env, "ECHO_KEY": key}, "serve", str(cfg), "--run-dir", str(run_dir))]
    assert serve.returncode == 1 and "launch failed" in serve.stderr, serve.stdout + serve.stderr
    console = serve.stdout + serve.stderr
    assert "--- log tail ---" in console and "argv: [" in console and "-c', '4096'" in console, console
    assert "HF_TOKEN=***" in console and "api_key=***" in console and "'hf_token': '***'" in console, console
    assert "\x1b" not in console and "\\x1b[2J" in console  # terminal controls shown escaped, not acted on
    # server.log is the engine's own output, kept as it wrote it (0600, in a 0700 folder): harvest
    # redacts what it shows and records of it, not the engine's file.
    log = run_dir / "server.log"
    assert hf in log.read_text() and stat.S_IMODE(log.stat().st_mode) == 0o600
    for secret in (hf, key):
        assert assert_nowhere(secret, [run_dir, tmp_path / "state"], outputs, skip=(log,)) >= 2
