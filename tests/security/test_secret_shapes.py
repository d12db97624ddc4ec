"""Secrets known by their shape, not their name, followed to every place harvest shows them.

The shapes: a token as a URL's user part (``http://TOKEN@host``), a credential-named query
parameter (``?api_key=``, ``&access_token=``) in ``base_url``, ``[client] endpoints`` or a health
URL, a ``[server.env]`` value that is an HTTP credential (``AUTH_HEADER = "Bearer ..."``) whatever
its name, and ``NAME=VALUE`` with a secret name on the engine's command line (refused at load: the
launcher's argv is in /proc/PID/cmdline). Each campaign still reaches the server with the values
as given; each secret is then searched (``test_secret_paths.assert_nowhere``) in every file under
the run folder and the state dir, every console capture and every ``/proc/PID/cmdline``.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harvest.net import port_listening
from tests import engines
from tests.security.attack import data_file
from tests.security.test_secret_paths import CHAT_ENGINE, assert_nowhere, env, harvest  # noqa: F401


def job_meta(run_dir: Path) -> dict:
    conn = sqlite3.connect(f"file:{run_dir / 'ledger.sqlite'}?mode=ro", uri=True)
    try:
        return json.loads(conn.execute("SELECT value FROM meta WHERE key = 'job'").fetchone()[0])
    finally:
        conn.close()


def test_a_token_as_a_url_user_or_a_query_key_is_redacted_everywhere_and_still_sent(tmp_path, env):
    """Two real campaigns against one chat server: tokens as URL user parts, then a key as query
    parameters (which the server receives on every request)."""
    user, user2, query = ("tu-" + secrets.token_hex(10) for _ in range(3))
    port = engines.free_port()
    log = tmp_path / "requests.log"
    engine = subprocess.Popen([sys.executable, str(CHAT_ENGINE), "--host", "127.0.0.1", "--port", str(port),
                               "--life", "300", "--request-log", str(log)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        end = time.monotonic() + 30
        while time.monotonic() < end and not port_listening("127.0.0.1", port, timeout=0.5):
            time.sleep(0.1)
        common = (f'[data]\npath = "{data_file(tmp_path, 6)}"\nid_field = "id"\n[sampling]\nmax_tokens = 4\n'
                  f'[run]\nprogress_interval = 0.2\n')
        run_dir = tmp_path / "run"
        job = tmp_path / "job.toml"
        job.write_text(f'[server]\nengine = "openai"\nbase_url = "http://{user}@127.0.0.1:{port}/v1"\n'
                       f'[client]\nconcurrency = 2\nendpoints = ["http://{user2}:x-basic@localhost:{port}/v1"]\n'
                       f'{common}[output]\ndir = "{run_dir}"\n')
        outputs = [run := harvest(env, "run", str(job), "--no-live")]
        assert run.returncode == 0, run.stdout + run.stderr
        assert log.read_text().count("/v1/chat/completions") >= 6  # sent, with the URLs as given
        outputs.append(status := harvest(env, "status", str(run_dir), "--json"))
        assert status.returncode == 0 and json.loads(status.stdout)["totals"]["settled"] == 6, status.stdout
        outputs += [harvest(env, "status", str(run_dir)), harvest(env, "report", str(run_dir)),
                    pf := harvest(env, "preflight", str(job))]
        assert f"openai on http://***@127.0.0.1:{port}/v1," in pf.stdout, pf.stdout
        assert all(o.returncode == 0 for o in outputs), [(o.args[3:], o.stderr) for o in outputs]
        assert {"report.html", "timeline.json", "progress.json"} <= {p.name for p in run_dir.iterdir()}
        meta = job_meta(run_dir)  # where the URLs were, they stay readable with the user part hidden
        assert meta["server"]["base_url"] == f"http://***@127.0.0.1:{port}/v1", meta["server"]
        assert meta["client"]["endpoints"] == [f"http://***@localhost:{port}/v1"]

        # A key as a query parameter: sent on every request (after harvest's path), hidden where shown.
        q_dir = tmp_path / "query"
        q_job = tmp_path / "query.toml"
        q_job.write_text(f'[server]\nengine = "openai"\nbase_url = "http://127.0.0.1:{port}/v1?api_key={query}"\n'
                         f'[client]\nendpoints = ["http://127.0.0.1:{port}/v1?api_key={query}&access_token={query}&token={query}"]\n'
                         f'{common}[output]\ndir = "{q_dir}"\n')
        before = log.read_text().count("\n")
        outputs.append(q_run := harvest(env, "run", str(q_job), "--no-live"))
        assert q_run.returncode == 0, q_run.stdout + q_run.stderr
        sent = log.read_text().splitlines()[before:]
        asked = {f"/v1/chat/completions?api_key={query}", f"/v1/chat/completions?api_key={query}&access_token={query}&token={query}"}
        odd = [line for line in sent if line not in asked]  # base_url and the endpoint, each with its query
        assert len(sent) >= 6 and odd == [], odd
        meta = job_meta(q_dir)
        assert meta["client"]["endpoints"] == [f"http://127.0.0.1:{port}/v1?api_key=***&access_token=***&token=***"]
        assert meta["server"]["base_url"] == f"http://127.0.0.1:{port}/v1?api_key=***", meta["server"]
        outputs += [harvest(env, "status", str(q_dir), "--json"), harvest(env, "status", str(q_dir)),
                    harvest(env, "report", str(q_dir)), harvest(env, "preflight", str(q_job))]
        for secret in (user, user2, query):
            assert assert_nowhere(secret, [run_dir, q_dir, tmp_path / "state"], outputs) >= 8
    finally:
        engine.kill()
        engine.wait(10)


def test_a_bearer_env_value_and_a_health_url_token_are_redacted_through_a_launched_campaign(tmp_path, env):
    bearer, health, proxy = ("tb-" + secrets.token_hex(10) for _ in range(3))
    port = engines.free_port()
    argv = [sys.executable, str(CHAT_ENGINE), "--host", "{host}", "--port", "{port}", "--life", "300"]
    run_dir = tmp_path / "run"
    job = tmp_path / "job.toml"
    job.write_text(f'[server]\nengine = "command"\nport = {port}\nready_timeout = 30\nstop_grace = 2\n'
                   f'stop_deadline = 6\nhealth_url = "http://{{host}}:{{port}}/health?token={health}"\n'
                   f'command = {json.dumps(argv)}\n'
                   f'[server.env]\nAUTH_HEADER = "Bearer {bearer}"\nUPSTREAM = "http://{proxy}@127.0.0.1:9/v1"\n'
                   f'[preflight]\nmin_disk_free_gib = 0.05\n[data]\npath = "{data_file(tmp_path, 6)}"\n'
                   f'id_field = "id"\n[sampling]\nmax_tokens = 4\n[client]\nconcurrency = 2\n'
                   f'[output]\ndir = "{run_dir}"\n[run]\nprogress_interval = 0.2\n')
    outputs = [run := harvest(env, "run", str(job), "--no-live")]
    assert run.returncode == 0, run.stdout + run.stderr
    outputs += [status := harvest(env, "status", str(run_dir), "--json"), harvest(env, "report", str(run_dir)),
                harvest(env, "export", str(run_dir), "--format", "sharegpt", "--status", "done,truncated")]
    assert all(o.returncode == 0 for o in outputs), [(o.args[3:], o.stderr) for o in outputs]
    assert json.loads(status.stdout)["totals"]["settled"] == 6, status.stdout
    server = job_meta(run_dir)["server"]
    assert server["env"] == {"AUTH_HEADER": "***", "UPSTREAM": "http://***@127.0.0.1:9/v1"}, server
    assert server["health_url"] == "http://{host}:{port}/health?token=***", server
    for secret in (bearer, health, proxy):
        assert assert_nowhere(secret, [run_dir, tmp_path / "state"], outputs) >= 8


@pytest.mark.parametrize(("name", "command"), [
    ("MY_API_KEY", ["env", "MY_API_KEY={s}", "{py}", "srv.py"]),
    ("HF_TOKEN", ["sh", "-c", "A=1 HF_TOKEN={s} exec {py} srv.py"]),
    ("AUTH", ["env", "AUTH=Bearer {s}", "{py}", "srv.py"]),
])
def test_a_secret_assignment_on_the_command_line_is_refused_at_load_naming_the_variable(tmp_path, env, name,
                                                                                        command):
    secret = "sv-" + secrets.token_hex(10)
    run_dir = tmp_path / "run"
    argv = [a.format(s=secret, py=sys.executable) for a in command]
    job = tmp_path / "job.toml"
    job.write_text(f'[server]\nengine = "command"\ncommand = {json.dumps(argv)}\n'
                   f'health_url = "http://{{host}}:{{port}}/h"\n'
                   f'[data]\npath = "{data_file(tmp_path, 6)}"\n[output]\ndir = "{run_dir}"\n')
    outputs = [harvest(env, "run", str(job), "--no-live"), harvest(env, "serve", str(job), "--detach"),
               harvest(env, "preflight", str(job))]
    for done in outputs:
        assert done.returncode == 2, done.args[3:] + [done.stdout, done.stderr]
        said = f"`command` sets {name} on the command line: every user of this machine can read"
        assert said in done.stderr, done.stderr
        assert f"Set {name} in [server.env] instead" in done.stderr and "Traceback" not in done.stderr
    assert not run_dir.exists() and not (tmp_path / "state").exists()
    assert_nowhere(secret, [tmp_path], outputs, skip=(job,))
