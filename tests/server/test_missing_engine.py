"""An engine that is not there is named before anything else happens: before preflight, before a
run folder's server record, with where it was looked for and where it comes from."""

from __future__ import annotations

import os
import subprocess
import sys
from tests import harvest_process


def serve(tmp_path, server: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "server.toml"
    cfg.write_text(server + "[preflight]\nmin_disk_free_gib = 0.05\n")
    return harvest_process.run([sys.executable, "-m", "harvest", "serve", str(cfg), "--run-dir", str(tmp_path / "run")],
                               capture_output=True, text=True, timeout=120, env=env, check=False)


def test_llama_server_not_on_path_names_it_and_how_to_get_it(tmp_path):
    env = {**os.environ, "PATH": "/usr/bin:/bin", "HARVEST_STATE_DIR": str(tmp_path / "state")}
    out = serve(tmp_path, '[server]\nengine = "llamacpp"\nmodel = "/models/m.gguf"\nport = 18999\n', env)
    assert out.returncode == 1, out.stderr
    assert ("llama-server is not on PATH (/usr/bin:/bin) (engine 'llamacpp'): scripts/install-engines llamacpp "
            "builds llama-server") in out.stderr, out.stderr
    assert '[server] command = ["/path/to/llama-server"]' in out.stderr
    assert "preflight" not in out.stderr and "Errno" not in out.stderr
    assert not (tmp_path / "run" / "launch.json").exists()


def test_a_command_or_python_that_does_not_exist_is_named_with_its_field(tmp_path):
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}
    gone = tmp_path / "bin" / "llama-server"
    out = serve(tmp_path, f'[server]\nengine = "llamacpp"\nmodel = "/m.gguf"\ncommand = ["{gone}"]\n', env)
    assert out.returncode == 1 and f"{gone} does not exist ([server] command)" in out.stderr, out.stderr
    python = tmp_path / "venv" / "bin" / "python"
    out = serve(tmp_path, f'[server]\nengine = "vllm"\nmodel = "/m"\npython = "{python}"\n', env)
    assert out.returncode == 1 and f"{python} does not exist ([server] python)" in out.stderr, out.stderr
    assert "scripts/install-engines vllm" in out.stderr
