"""R6: with a real llama-server protected by an API key, no file harvest writes holds the key, every
file it writes is private (0600) in private folders (0700), and the engine listens on loopback only.

The key travels the documented way, through ``api_key_env``. The test runs what a user runs, each
as its own process: a campaign (`harvest run`, which launches and stops the server), `harvest
status`, `harvest export`, `harvest serve --detach` / `harvest ps` / `harvest stop`, and a launch
that fails (a missing model) so the error path is covered too. Then it reads every file under the
test's folder (run folders, server run folders, the index of runs, the export) and everything the
commands printed, looking for the key.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import stat
import subprocess
import sys

import psutil
import pytest

from harvest import http
from harvest.server import StateFile
from tests import engines, harvest_process
from tests.security.test_secret_paths import other_users_cmdlines

pytestmark = [pytest.mark.engine]


def ledger_meta(run_dir) -> dict:
    conn = sqlite3.connect(f"file:{run_dir / 'ledger.sqlite'}?mode=ro", uri=True)
    try:
        return {k: json.loads(v) for k, v in conn.execute("SELECT key, value FROM meta")}
    finally:
        conn.close()


def _harvest(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return harvest_process.run([sys.executable, "-m", "harvest", *args], capture_output=True, text=True,
                               timeout=timeout, env=env, stdin=subprocess.DEVNULL)


#: A secret users put in a config besides the documented key: a token in ``[server.env]``. It may
#: not be written down either. (A key pasted into ``extra_args`` is refused at load: see
#: test_secret_paths.py.)
HF_TOKEN = "hf_" + secrets.token_hex(12)


def _server_table(bin_: str, model: str, port: int) -> str:
    return (f'[server]\nengine = "llamacpp"\nmodel = "{model}"\ncommand = ["{bin_}"]\nport = {port}\n'
            f'api_key_env = "HARVEST_SECRET_TEST_KEY"\nmax_running_requests = 4\n'
            f'extra_args = ["-c", "4096"]\n'
            f'ready_timeout = 60\nstop_grace = 3\nstop_deadline = 20\n'
            f'[server.env]\nHF_TOKEN = "{HF_TOKEN}"\n'
            f'[preflight]\nmin_disk_free_gib = 0.1\nram_reserve_gib = 0\n')


def test_api_key_never_written_and_every_file_private(tmp_path, llama_server_bin, tiny_gguf):
    key = "sk-harvest-" + secrets.token_hex(16)
    env = {**os.environ, "HARVEST_SECRET_TEST_KEY": key, "HARVEST_STATE_DIR": str(tmp_path / "state")}
    outputs: list[subprocess.CompletedProcess[str]] = []
    run_dir = tmp_path / "run"
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"Say {i}."}) + "\n" for i in range(60)))
    job = tmp_path / "job.toml"
    job.write_text(_server_table(llama_server_bin, str(tiny_gguf), engines.free_port())
                   + f'[data]\npath = "{data}"\nid_field = "id"\n[sampling]\nmax_tokens = 8\n'
                   f'[client]\nconcurrency = 4\n[output]\ndir = "{run_dir}"\n'
                   f'[run]\nprogress_interval = 0.5\n')

    # 1. A campaign through the keyed server, then what users read it with.
    outputs.append(run := _harvest(env, "run", str(job), "--no-live"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "done 60" in run.stdout or "truncated 60" in run.stdout, run.stdout
    outputs.append(_harvest(env, "status", str(run_dir), "--json"))
    outputs.append(export := _harvest(env, "export", str(run_dir), "--format", "sharegpt", "--status",
                                      "done,truncated"))
    assert export.returncode == 0, export.stderr
    # The ledger keeps the job (to resume and audit it) with the pasted secret redacted.
    job_meta = ledger_meta(run_dir)["job"]["server"]
    assert job_meta["env"] == {"HF_TOKEN": "***"} and job_meta["extra_args"] == ["-c", "4096"], job_meta

    # 2. A detached server: measured listening on loopback only; ps; stop from another process.
    serve_cfg = tmp_path / "serve.toml"
    serve_cfg.write_text(_server_table(llama_server_bin, str(tiny_gguf), engines.free_port()))
    serve_dir = tmp_path / "served"
    outputs.append(serve := _harvest(env, "serve", str(serve_cfg), "--run-dir", str(serve_dir), "--detach"))
    try:
        assert serve.returncode == 0, serve.stdout + serve.stderr
        rec = StateFile(serve_dir).read().record
        engine = psutil.Process(rec.pid)
        # The engine got the key through its environment, which only its owner can read, and
        # not on its command line, which every user of the machine can (`ps`, /proc/PID/cmdline).
        assert key not in " ".join(engine.cmdline())
        seen = other_users_cmdlines()  # every /proc/PID/cmdline as user nobody reads it
        assert seen is None or (engine.name() in seen and key not in seen and HF_TOKEN not in seen)
        assert engine.environ().get("LLAMA_API_KEY") == key
        unauthorized = http.get(f"http://127.0.0.1:{rec.port}/v1/models", timeout=10)
        authorized = http.get(f"http://127.0.0.1:{rec.port}/v1/models", timeout=10,
                              headers={"Authorization": f"Bearer {key}"})
        assert (unauthorized.status, authorized.status) == (401, 200)  # ...and enforces it
        listening = {c.laddr.ip for c in psutil.net_connections(kind="tcp")
                     if c.pid == engine.pid and c.status == psutil.CONN_LISTEN}
        assert listening == {"127.0.0.1"}, listening  # ...and serves loopback only (the default host)
        outputs.append(_harvest(env, "ps", "--json"))
    finally:
        outputs.append(stop := _harvest(env, "stop", str(serve_dir), "--json"))
    assert stop.returncode == 0, stop.stdout + stop.stderr

    # 3. A launch that fails: the error message and its log tail.
    bad_cfg = tmp_path / "bad.toml"
    broken = tmp_path / "broken.gguf"  # there (the preflight's paths rule passes), but no GGUF: llama-server fails
    broken.write_bytes(b"not a GGUF file\n" * 64)
    bad_cfg.write_text(_server_table(llama_server_bin, str(broken), engines.free_port()))
    outputs.append(bad := _harvest(env, "serve", str(bad_cfg), "--run-dir", str(tmp_path / "failed")))
    assert bad.returncode == 1 and "launch failed" in bad.stderr, bad.stdout + bad.stderr

    # Nothing printed and no file written holds the key.
    written = [p for p in tmp_path.rglob("*") if p.is_file() and not (p.parent == tmp_path and p.suffix == ".toml")]  # minus the test's configs
    assert len(written) > 15, written
    for secret in (key, HF_TOKEN):
        for out in outputs:
            assert secret not in out.stdout and secret not in out.stderr, out.args
        holding = [str(p) for p in written if secret.encode() in p.read_bytes()]
        assert holding == [], secret[:3]

    # Every file harvest wrote in a run folder, a server run folder or the index is 0600, and
    # every folder 0700.
    harvest_dirs = [run_dir, serve_dir, tmp_path / "failed", tmp_path / "state" / "runs"]
    checked = 0
    for top in harvest_dirs:
        for p in [top, *top.rglob("*")]:
            mode = stat.S_IMODE(p.lstat().st_mode)
            want = 0o700 if p.is_dir() else 0o600
            assert mode == want, f"{p} has mode {mode:o}, expected {want:o}"
            checked += 1
    names = {p.name for top in harvest_dirs for p in top.rglob("*")}
    for expected in ("ledger.sqlite", "ledger.lock", "progress.json", "launch.json", "server.log",
                     "stop.json", "watch.log", "export.sharegpt.jsonl"):
        assert expected in names, (expected, sorted(names))
    assert checked > 15
