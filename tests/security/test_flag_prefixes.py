"""Flags as the engine's parser reads them: a secret or an address in a spelling that is not the
flag's own is refused at load, like the flag itself.

vLLM's and SGLang's parsers take any unambiguous prefix (``--api-ke KEY`` is ``--api-key KEY``,
``--hos=0.0.0.0`` is ``--host 0.0.0.0``), vLLM reads ``_`` as ``-``, and a program started by
``engine = "command"`` may read ``--host 0.0.0.0`` however it likes. Each such spelling is refused
when the config loads (``run``, ``serve`` and ``preflight`` exit 2 with one line naming file,
field and the full flag) before anything is spawned or written; the secret is in no file under
the test's folders (run folder and state dir included), no console output and no command line
another user reads. Everyday flags keep working. That the option lists are the engines' own is
held by tests/server/test_engine_options.py.
"""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

import pytest

from harvest.config import load_config, parse_config
from harvest.errors import ConfigError
from tests.security.attack import data_file
from tests.security.test_secret_paths import assert_nowhere, harvest


@pytest.fixture
def env(tmp_path):
    import os

    return {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}


def _job(tmp_path: Path, server: str) -> tuple[Path, Path]:
    run_dir = tmp_path / "run"
    job = tmp_path / "job.toml"
    job.write_text(f"[server]\n{server}\n[data]\npath = \"{data_file(tmp_path, 6)}\"\n[output]\ndir = \"{run_dir}\"\n")
    return job, run_dir


def _refused_by_every_command(env: dict[str, str], job: Path, shown: str) -> list:
    outputs = [harvest(env, "run", str(job), "--no-live"), harvest(env, "serve", str(job), "--detach"),
               harvest(env, "preflight", str(job))]
    for done in outputs:
        assert done.returncode == 2, done.args[3:] + [done.stdout, done.stderr]
        assert "Traceback" not in done.stderr, done.stderr
        problem = [ln for ln in done.stderr.splitlines() if shown in ln]
        assert len(problem) == 1, done.stderr  # one line: file, table, field and the flag in full
    return outputs


@pytest.mark.parametrize(("engine", "form"), [("vllm", '"--api-ke", "{s}"'), ("vllm", '"--api-ke={s}"'),
                                            ("sglang", '"--api-ke", "{s}"'), ("sglang", '"--api-ke={s}"')])
def test_a_key_behind_a_prefix_of_api_key_is_refused_at_load_and_never_reaches_anything(tmp_path, env, engine,
                                                                                         form):
    secret = "sk-" + secrets.token_hex(10)
    job, run_dir = _job(tmp_path, f'engine = "{engine}"\nmodel = "m"\nextra_args = ["--dtype", "auto", '
                                  f'{form.format(s=secret)}]')
    name = {"vllm": "vLLM", "sglang": "SGLang"}[engine]
    shown = f"{job} [server] extra_args: `extra_args` holds --api-ke ({name} reads it as --api-key)"
    outputs = _refused_by_every_command(env, job, shown)
    assert "api_key_env" in outputs[0].stderr
    assert not run_dir.exists() and not (tmp_path / "state").exists()  # refused before anything was made
    assert_nowhere(secret, [tmp_path], outputs, skip=(job,))


@pytest.mark.parametrize(("engine", "args", "reads"), [
    ("vllm", ["--api_k=sv-hidden"], "--api_k (vLLM reads it as --api-key)"),  # vLLM reads '_' as '-'
    ("vllm", ["--api-ke.x", "sv-hidden"], "--api-ke.x (vLLM reads it as --api-key)"),  # vLLM's --name.field V
    ("vllm", ["--hf-tok", "sv-hidden"], "--hf-tok (vLLM reads it as --hf-token)"),
    ("sglang", ["--api", "sv-hidden"], "--api (SGLang reads it as --api-key)"),
    ("sglang", ["--admin-api=sv-hidden"], "--admin-api (SGLang reads it as --admin-api-key)"),
    ("sglang", ["--ssl-keyfile-pass", "sv-hidden"], "--ssl-keyfile-pass (SGLang reads it as --ssl-keyfile-password)"),
    # Tokens the engine refuses, but only once started, with the key on its command line and in
    # the launch record: read as any known engine may read them.
    ("sglang", ["--api_k=sv-hidden"], "--api_k (harvest reads it as --api-key)"),
    ("llamacpp", ["--api-ke", "sv-hidden"], "--api-ke (harvest reads it as --api-key)"),
    ("llamacpp", ["--hf_token", "sv-hidden"], "--hf_token (llama.cpp reads it as --hf-token)"),
])
def test_every_spelling_the_engine_may_read_as_a_secret_flag_is_refused(engine, args, reads):
    with pytest.raises(ConfigError) as info:
        parse_config({"server": {"engine": engine, "model": "m", "extra_args": args}}, source="j.toml")
    ((loc, msg),) = info.value.problems
    assert loc == "j.toml [server] extra_args" and msg.startswith(f"`extra_args` holds {reads}: "), msg
    assert "/proc/PID/cmdline" in msg and "api_key_env" in msg and "sv-hidden" not in msg


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize(("args", "written", "flag"), [
    (["--hos=0.0.0.0"], "--hos", "--host"),
    (["--ho", "0.0.0.0"], "--ho", "--host"),  # unambiguous in both pinned parsers
    (["--por=8001"], "--por", "--port"),
])
def test_the_address_in_a_prefix_is_refused_at_load(tmp_path, env, engine, args, written, flag):
    name = {"vllm": "vLLM", "sglang": "SGLang"}[engine]
    extra = ", ".join(f'"{a}"' for a in args)
    job, run_dir = _job(tmp_path, f'engine = "{engine}"\nmodel = "m"\nextra_args = [{extra}]')
    shown = (f"{job} [server] extra_args: `extra_args` holds {written} ({name} reads it as {flag}): "
             f"set [server] {flag[2:]} instead")
    if args == ["--hos=0.0.0.0"]:
        _refused_by_every_command(env, job, shown)
        assert not run_dir.exists() and not (tmp_path / "state").exists()
    with pytest.raises(ConfigError) as info:
        load_config(job)
    ((loc, msg),) = info.value.problems
    assert f"{loc}: {msg}".startswith(shown) and "api_key_env" in msg, msg


def test_an_ambiguous_prefix_that_may_be_a_secret_is_refused_naming_the_candidates():
    # vLLM has --api-key and --api-server-count: its parser refuses "--api", and a version with
    # one of them gone would read it as the other.
    with pytest.raises(ConfigError) as info:
        parse_config({"server": {"engine": "vllm", "model": "m", "extra_args": ["--api", "x"]}}, source="j.toml")
    text = str(info.value)
    assert "holds --api, which vLLM may read as any of --api-key, --api-server-count" in text, text


@pytest.mark.parametrize(("engine", "args"), [
    ("vllm", ["--max-num-seqs", "8", "--max-num-batched-tokens", "4096", "--enforce-eager", "--kv-cache-dtype",
              "fp8", "--ssl-keyfile", "k.pem", "--max_model_len=2048", "-tp", "1", "--enable-prefix-caching",
              "--seed", "-1", "--"]),
    ("sglang", ["--max-running-requests", "8", "--ssl-keyfile", "k.pem", "--chunked-prefill-size", "512",
                "--context-length=4096", "--disable-radix-cache"]),
    ("llamacpp", ["--api-key-file", "keys.txt", "--ssl-key-file", "k.pem", "-c", "4096", "--n_gpu_layers", "0"]),
    ("command", ["--max-num-seqs", "8", "--ssl-keyfile", "k.pem", "--tokenizer", "t"]),
])
def test_everyday_flags_still_load(engine, args):
    fields = {"command": ["srv", "--host", "{host}", "--port", "{port}"]} if engine == "command" else {"model": "m"}
    cfg = parse_config({"server": {"engine": engine, **fields, "extra_args": args}}, source="j.toml")
    assert cfg.require_server().extra_args == args


def test_a_prefix_of_max_logprobs_raises_the_logprobs_limit_as_vllm_reads_it():
    cfg = parse_config({"server": {"engine": "vllm", "model": "m", "extra_args": ["--max-logp", "30"]},
                        "sampling": {"logprobs": 25}}, source="j.toml")
    assert cfg.sampling.logprobs == 25


PUBLIC_IN_COMMAND = [["--host", "0.0.0.0"], ["--host=::"], ["--hos", "0.0.0.0"], ["--hos=0.0.0.0"],
                     ["--ho", "10.0.0.1"], ["--HOST", "0.0.0.0"], ["--host", "{host}"]]


@pytest.mark.parametrize("args", PUBLIC_IN_COMMAND)
def test_a_public_host_in_command_needs_an_api_key_like_server_host(tmp_path, args):
    # The rule of [server] host (tests/security/test_bind.py): a non-loopback address needs api_key_env.
    host = "0.0.0.0" if "{host}" in args else "127.0.0.1"
    command = ["srv", *args, "--port", "{port}"]
    with pytest.raises(ConfigError) as info:
        parse_config({"server": {"engine": "command", "command": command, "host": host}}, source="j.toml")
    ((loc, msg),) = info.value.problems
    assert loc == "j.toml [server]", loc
    assert "is not a loopback address" in msg and "api_key_env" in msg and "loopback" in msg, msg
    if "{host}" not in args:
        assert f"`command` holds {args[0].partition('=')[0]} " in msg, msg
    cfg = parse_config({"server": {"engine": "command", "command": command, "host": host, "api_key_env": "K"}},
                       source="j.toml")
    assert cfg.require_server().command == command  # with a key: allowed, as for [server] host


@pytest.mark.parametrize("args", [["--host", "127.0.0.1"], ["--hos=::1"], ["--host", "localhost"],
                                  ["--host", "{host}"], ["--hostname-file", "0.0.0.0"]])
def test_a_loopback_host_in_command_needs_no_key(args):
    cfg = parse_config({"server": {"engine": "command", "command": ["srv", *args]}}, source="j.toml")
    assert cfg.require_server().command == ["srv", *args]


def test_serve_refuses_a_public_host_in_command_before_spawning_it(tmp_path, env):
    marker = tmp_path / "spawned"
    job, run_dir = _job(tmp_path, f'engine = "command"\ncommand = ["{sys.executable}", "-c", '
                                  f'"open(\'{marker}\', \'w\').close()", "--hos", "0.0.0.0"]\n')
    outputs = _refused_by_every_command(env, job, "`command` holds --hos '0.0.0.0' (read as --host)")
    assert "api_key_env" in outputs[1].stderr
    assert not marker.exists() and not run_dir.exists()  # nothing was spawned, nothing written


@pytest.mark.parametrize("token", ["--api-ke", "--hf-tok", "--ADMIN_API_KEY", "--ssl-keyfile-pass", "-hft"])
def test_command_reads_a_prefix_of_any_engines_secret_flag_as_that_flag(token):
    with pytest.raises(ConfigError) as info:
        parse_config({"server": {"engine": "command", "command": ["srv", token, "v"]}}, source="j.toml")
    assert f"`command` holds {token}" in str(info.value) and "/proc/PID/cmdline" in str(info.value)


def test_a_tune_grid_with_a_prefixed_key_is_refused_before_any_launch_without_echoing_it():
    from harvest.campaign.sweep.tune import expand_grid
    from harvest.campaign.sweep.tune_file import parse_tune_file
    from harvest.config import ServerConfig

    secret = "sk-" + secrets.token_hex(10)
    base = ServerConfig(engine="vllm", model="m")
    grid = {"extra_args": [["--max-num-seqs", "8"], ["--api-ke", secret], [f"--hos={secret}"]]}
    with pytest.raises(ConfigError) as info:
        expand_grid(base, parse_tune_file({"grid": [grid]}, source="tune.toml"))
    text = str(info.value)
    assert "tune.toml [grid] extra_args" in text and "holds --api-ke (vLLM reads it as --api-key)" in text, text
    assert secret not in text


def test_tune_and_compare_refuse_a_prefixed_key_in_their_candidates_before_any_launch(tmp_path, env):
    secret = "sk-" + secrets.token_hex(10)
    job, run_dir = _job(tmp_path, 'engine = "vllm"\nmodel = "m"')
    grid = tmp_path / "tune.toml"
    grid.write_text(f'[[grid]]\nextra_args = [["--max-num-seqs", "8"], ["--api-ke", "{secret}"]]\n')
    candidate = tmp_path / "candidate.toml"
    candidate.write_text(f'[server]\nengine = "sglang"\nmodel = "m"\nextra_args = ["--api-ke={secret}"]\n')
    outputs = [harvest(env, "tune", str(job), "--grid", str(grid)),
               harvest(env, "compare", "--reference", str(job), "--candidate", str(candidate))]
    for done, reads in zip(outputs, ["vLLM reads it as --api-key", "SGLang reads it as --api-key"]):
        assert done.returncode == 2, done.args[3:] + [done.stdout, done.stderr]
        assert f"holds --api-ke ({reads})" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not run_dir.exists()  # no tune or compare folder: nothing launched
    assert_nowhere(secret, [tmp_path], outputs, skip=(grid, candidate))
