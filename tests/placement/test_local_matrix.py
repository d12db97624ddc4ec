"""The placement matrix on this machine: gpus, preflight, serve --detach + ps + stop, run, tune (two
candidates) and compare of a job without [host] or [cluster], on a real engine (llama-server on the
tiny model); every document in its documented shape, every server found and stopped here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import engines, harvest_process
from tests.placement.matrix import Place, every_command

pytestmark = [pytest.mark.engine]
HARVEST = str(Path(sys.executable).with_name("harvest"))


def llama_server(binary: str, gguf: Path, port: int) -> dict[str, object]:
    return {"engine": "llamacpp", "model": str(gguf), "command": [binary], "port": port,
            "extra_args": ["-c", "2048"], "ready_timeout": 120, "stop_grace": 3, "stop_deadline": 20}


PREFLIGHT = {"min_disk_free_gib": 0.05, "ram_reserve_gib": 0}


def test_every_command_here(tmp_path, llama_server_bin, tiny_gguf):
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}

    def harvest(*args: str) -> subprocess.CompletedProcess:
        return harvest_process.run([HARVEST, *args], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)

    tables = {"server": llama_server(llama_server_bin, tiny_gguf, engines.free_port()), "preflight": PREFLIGHT}
    every_command(Place("local", harvest, tables, where=lambda w: w == "this machine"), tmp_path)
