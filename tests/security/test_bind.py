"""R6: servers bind 127.0.0.1 unless the config says otherwise, and a public address needs an API key.

Refused at config validation (no ``api_key_env``) or at launch (the variable is not set), with an
error naming the field, before anything is spawned. ``transformers serve`` takes no API key, so it
is never bound to a public address by harvest. That the engine really listens on loopback only is
measured in test_secrets.py, on a real llama-server.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from harvest.config import ServerConfig, load_config, parse_config
from harvest.errors import ConfigError
from harvest.server import Server
from harvest.server.base import adapter_for
from tests import harvest_process

PUBLIC = ["0.0.0.0", "::", "", "192.168.1.5", "10.0.0.1", "2001:db8::1", "gpu-box.example.com"]
LOOPBACK = ["127.0.0.1", "127.0.0.2", "::1", "localhost"]
KEYED = {"sglang": {"model": "m"}, "vllm": {"model": "m"}, "llamacpp": {"model": "m.gguf"},
         "command": {"command": ["serve", "--host", "{host}", "--port", "{port}"]}}


def _toml_value(v: object) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(f'"{x}"' for x in v) + "]"
    return f'"{v}"'


def _write(tmp_path: Path, engine: str, host: str, **extra: object) -> Path:
    fields = {"engine": engine, "host": host, **KEYED.get(engine, {"model": "m"}), **extra}
    path = tmp_path / f"{engine}.toml"
    path.write_text("[server]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in fields.items()))
    return path


@pytest.mark.parametrize("engine", ["sglang", "vllm", "llamacpp", "transformers", "command"])
def test_the_default_host_is_loopback_and_reaches_the_engine_argv(engine):
    cfg = ServerConfig(engine=engine, **KEYED.get(engine, {"model": "m"}))
    assert cfg.host == "127.0.0.1"
    argv = adapter_for(engine).argv(cfg)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"


@pytest.mark.parametrize("host", PUBLIC)
@pytest.mark.parametrize("engine", sorted(KEYED))
def test_a_public_host_without_an_api_key_is_refused_naming_the_fields(tmp_path, engine, host):
    path = _write(tmp_path, engine, host)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    ((loc, msg),) = info.value.problems
    assert loc == f"{path} [server]"
    assert "host" in msg and "api_key_env" in msg and "loopback" in msg, msg

    cfg = load_config(_write(tmp_path, engine, host, api_key_env="SOME_KEY_VAR"))  # with a key: allowed
    assert cfg.require_server().host == host


@pytest.mark.parametrize("host", LOOPBACK)
def test_loopback_hosts_need_no_key(tmp_path, host):
    assert load_config(_write(tmp_path, "vllm", host)).require_server().host == host


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.1"])
def test_transformers_serve_takes_no_key_so_a_public_host_is_refused_outright(host):
    with pytest.raises(ConfigError) as info:
        parse_config({"server": {"engine": "transformers", "model": "m", "host": host, "api_key_env": "K"}},
                     source="t.toml")
    assert "transformers" in str(info.value) and "loopback" in str(info.value)


def test_a_public_host_whose_key_variable_is_unset_is_refused_at_launch(tmp_path, monkeypatch):
    monkeypatch.delenv("HARVEST_TEST_UNSET_KEY", raising=False)
    marker = tmp_path / "spawned"
    cfg = ServerConfig(engine="command", host="0.0.0.0", api_key_env="HARVEST_TEST_UNSET_KEY",
                       command=[sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"])
    server = Server(cfg, run_dir=tmp_path / "run")
    with pytest.raises(ConfigError) as info:
        server.launch()
    ((loc, msg),) = info.value.problems
    assert loc.endswith("[server] api_key_env") and "HARVEST_TEST_UNSET_KEY" in msg and "0.0.0.0" in msg
    assert not marker.exists() and server.pid is None  # nothing was spawned
    assert not (tmp_path / "run" / "launch.json").exists()


def test_harvest_serve_refuses_it_with_one_error_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HARVEST_TEST_UNSET_KEY"}
    env["HARVEST_STATE_DIR"] = str(tmp_path / "state")
    path = tmp_path / "server.toml"
    path.write_text('[server]\nengine = "llamacpp"\nmodel = "m.gguf"\nhost = "0.0.0.0"\n'
                    'api_key_env = "HARVEST_TEST_UNSET_KEY"\n')
    out = harvest_process.run([sys.executable, "-m", "harvest", "serve", str(path), "--run-dir",
                          str(tmp_path / "run")], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    assert "api_key_env" in out.stderr and "HARVEST_TEST_UNSET_KEY" in out.stderr
    no_key = tmp_path / "nokey.toml"
    no_key.write_text('[server]\nengine = "llamacpp"\nmodel = "m.gguf"\nhost = "0.0.0.0"\n')
    out = harvest_process.run([sys.executable, "-m", "harvest", "serve", str(no_key)], capture_output=True,
                              text=True, timeout=60, env=env)
    assert out.returncode == 2 and "api_key_env" in out.stderr, out.stderr
