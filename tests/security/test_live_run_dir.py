"""A --run-dir holding the record of a live server is that server's: a second ``harvest serve``
into it is refused, and the live server's record and log stay as they were (so ``ps`` and
``stop`` still find it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests import engines, harvest_process

CHAT_ENGINE = Path(__file__).resolve().parents[1] / "quality" / "chat_engine.py"


def harvest(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return harvest_process.run([sys.executable, "-m", "harvest", *args], capture_output=True, text=True,
                               timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def serve_config(path: Path) -> Path:
    argv = [sys.executable, str(CHAT_ENGINE), "--host", "{host}", "--port", "{port}"]
    path.write_text(f'[server]\nengine = "command"\nport = {engines.free_port()}\nready_timeout = 30\n'
                    f'stop_grace = 2\nstop_deadline = 6\nhealth_url = "http://{{host}}:{{port}}/health"\n'
                    f'command = {json.dumps(argv)}\n[preflight]\nmin_disk_free_gib = 0.05\n')
    return path


def test_a_second_serve_into_a_live_servers_run_dir_is_refused(tmp_path):
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}
    run_dir = tmp_path / "served"
    first = harvest(env, "serve", str(serve_config(tmp_path / "a.toml")), "--run-dir", str(run_dir), "--detach")
    assert first.returncode == 0, first.stdout + first.stderr
    try:
        record, log = (run_dir / "launch.json").read_bytes(), (run_dir / "server.log").read_bytes()
        pid = json.loads(record)["record"]["pid"]

        second = harvest(env, "serve", str(serve_config(tmp_path / "b.toml")), "--run-dir", str(run_dir),
                         "--detach")

        assert second.returncode == 2 and "Traceback" not in second.stderr, second.stdout + second.stderr
        assert f"{run_dir / 'launch.json'}: is the record of a live server (command, pid {pid}" in second.stderr
        assert (run_dir / "launch.json").read_bytes() == record and (run_dir / "server.log").read_bytes() == log
        ps = json.loads(harvest(env, "ps", "--json").stdout)
        assert [r["pid"] for r in ps["servers"]] == [pid], ps
    finally:
        stop = harvest(env, "stop", str(run_dir))
    assert stop.returncode == 0, stop.stdout + stop.stderr
    # Once it is stopped, the folder may be used again.
    again = harvest(env, "serve", str(serve_config(tmp_path / "c.toml")), "--run-dir", str(run_dir), "--detach")
    assert again.returncode == 0, again.stdout + again.stderr
    assert harvest(env, "stop", str(run_dir)).returncode == 0
