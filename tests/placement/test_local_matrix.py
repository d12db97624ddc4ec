"""serve --detach + ps + stop on this machine, on a real engine (llama-server on the tiny model)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import engines
from tests.placement.matrix import serve_ps_stop

pytestmark = [pytest.mark.engine]
HARVEST = str(Path(sys.executable).with_name("harvest"))


def llama_job(path: Path, binary: str, gguf: Path, port: int, **extra: str) -> Path:
    lines = [f'[server]\nengine = "llamacpp"\nmodel = "{gguf}"\ncommand = ["{binary}"]\nport = {port}\n'
             f'extra_args = ["-c", "2048"]\nready_timeout = 120\nstop_grace = 3\nstop_deadline = 20\n'
             f'[preflight]\nmin_disk_free_gib = 0.05\nram_reserve_gib = 0\n']
    lines += [f"[{name}]\n{body}\n" for name, body in extra.items()]
    path.write_text("".join(lines))
    return path


def test_serve_ps_stop_here(tmp_path, llama_server_bin, tiny_gguf):
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}

    def harvest(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([HARVEST, *args], capture_output=True, text=True, timeout=300, env=env)

    job = llama_job(tmp_path / "job.toml", llama_server_bin, tiny_gguf, engines.free_port())
    serve_ps_stop(harvest, job, tmp_path / "run", expect_where=lambda w: w == "this machine")
