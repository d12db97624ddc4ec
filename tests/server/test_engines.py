"""Engine adapters: the argv, environment, readiness checks, fatal lines and KV capacity they give."""

from __future__ import annotations

import sys
from typing import get_args
from urllib.parse import urlsplit

import pytest

from harvest.transport import MockTransport, RawResponse
from harvest.config import LAUNCHED_ENGINES, EngineKind, ServerConfig
from harvest.http import SyncHttp
from harvest.server import ENGINES, EngineAdapter, adapter_for
from harvest.server.readiness import first_fatal


def test_registry_has_one_adapter_per_engine_kind():
    assert set(ENGINES) == set(get_args(EngineKind))
    for kind in ENGINES:
        adapter = adapter_for(kind)
        assert isinstance(adapter, EngineAdapter)
        assert adapter.kind == kind
        assert adapter.launched == (kind in LAUNCHED_ENGINES)
    with pytest.raises(KeyError, match="known: command"):
        adapter_for("tgi")


def test_vllm_argv_maps_every_setting():
    cfg = ServerConfig(engine="vllm", model="/m/llama", python="/venv/bin/python", port=8123, tp=2, gpus=[2, 3],
                       gpu_memory_utilization=0.85, kv_cache_dtype="fp8", max_running_requests=128,
                       dtype="bfloat16", served_model_name="llama", extra_args=["--max-model-len", "4096"],
                       env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    a = adapter_for("vllm")
    assert a.argv(cfg) == [
        "/venv/bin/python", "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", "/m/llama",
        "--host", "127.0.0.1", "--port", "8123", "--tensor-parallel-size", "2",
        "--served-model-name", "llama", "--gpu-memory-utilization", "0.85", "--kv-cache-dtype", "fp8",
        "--max-num-seqs", "128", "--dtype", "bfloat16", "--max-model-len", "4096"]
    assert a.environment(cfg) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "2,3"}
    assert [c.path for c in a.readiness(cfg)] == ["/health", "/v1/models"]
    assert a.metrics.running == "vllm:num_requests_running"
    assert a.metrics.kv_usage == "vllm:kv_cache_usage_perc"


def test_python_defaults_to_the_one_running_harvest():
    cfg = ServerConfig(engine="vllm", model="m")
    assert adapter_for("vllm").argv(cfg)[0] == sys.executable


def test_sglang_argv_with_hierarchical_cache():
    cfg = ServerConfig(engine="sglang", model="/m/qwen", python="py", tp=4, gpus=[0, 1, 2, 3],
                       mem_fraction_static=0.82, kv_cache_dtype="fp8_e5m2", enable_hierarchical_cache=True,
                       hicache_size=32, max_running_requests=256)
    argv = adapter_for("sglang").argv(cfg)
    assert argv[:3] == ["py", "-m", "sglang.launch_server"]
    pairs = {argv[i]: argv[i + 1] for i in range(3, len(argv) - 1) if argv[i].startswith("--")}
    assert pairs["--model-path"] == "/m/qwen" and pairs["--tp-size"] == "4"
    assert pairs["--mem-fraction-static"] == "0.82" and pairs["--kv-cache-dtype"] == "fp8_e5m2"
    assert pairs["--hicache-size"] == "32" and pairs["--max-running-requests"] == "256"
    assert "--enable-hierarchical-cache" in argv and "--enable-metrics" in argv
    checks = adapter_for("sglang").readiness(cfg)
    assert [(c.method, c.path) for c in checks] == [("GET", "/health"), ("POST", "/generate")]
    assert checks[1].json["sampling_params"]["max_new_tokens"] == 1


def test_llamacpp_argv_uses_the_configured_binary():
    cfg = ServerConfig(engine="llamacpp", model="/m/tiny.gguf", command=["/opt/llama-server"], port=9000,
                       max_running_requests=4, kv_cache_dtype="q8_0")
    assert adapter_for("llamacpp").argv(cfg) == [
        "/opt/llama-server", "-m", "/m/tiny.gguf", "--host", "127.0.0.1", "--port", "9000", "--metrics",
        "--parallel", "4", "--cache-type-k", "q8_0", "--cache-type-v", "q8_0"]
    assert adapter_for("llamacpp").argv(ServerConfig(engine="llamacpp", model="x"))[0] == "llama-server"


def test_transformers_argv_positional_model_and_continuous_batching():
    cfg = ServerConfig(engine="transformers", model="/m/1b", python="py", gpus=[1], dtype="bfloat16",
                       gpu_memory_utilization=0.5)
    a = adapter_for("transformers")
    assert a.argv(cfg) == ["py", "-m", "transformers.cli.transformers", "serve", "/m/1b", "--continuous-batching",
                           "--host", "127.0.0.1", "--port", "8000", "--device", "cuda:0", "--dtype", "bfloat16",
                           "--cb-max-memory-percent", "0.5"]
    assert [c.path for c in a.readiness(cfg)] == ["/health"]  # /v1/models answers 500 for minutes


def test_command_placeholders_and_readiness():
    cfg = ServerConfig(engine="command", command=["srv", "--port={port}", "--bind", "{host}"], port=7001,
                       health_url="http://{host}:{port}/ok")
    a = adapter_for("command")
    assert a.argv(cfg) == ["srv", "--port=7001", "--bind", "127.0.0.1"]
    [check] = a.readiness(cfg)
    assert check.url == "http://127.0.0.1:7001/ok"
    no_health = ServerConfig(engine="command", command=["srv"])
    assert [c.kind for c in a.readiness(no_health)] == ["port"]


@pytest.mark.parametrize(("engine", "variable"), [("vllm", "VLLM_API_KEY"), ("llamacpp", "LLAMA_API_KEY")])
def test_api_key_goes_through_the_environment_where_the_engine_reads_it(monkeypatch, engine, variable):
    monkeypatch.setenv("MY_KEY", "sk-abc123")
    cfg = ServerConfig(engine=engine, model="m", api_key_env="MY_KEY")
    a = adapter_for(engine)
    assert "sk-abc123" not in " ".join(a.argv(cfg))  # argv is world-readable in /proc
    assert a.environment(cfg)[variable] == "sk-abc123"
    monkeypatch.delenv("MY_KEY")
    assert variable not in a.environment(cfg)


def test_sglang_takes_the_key_from_a_config_file_never_on_its_command_line(monkeypatch, tmp_path):
    # SGLang 0.5.23 merges `--config FILE.yaml` into its arguments inside the process
    # (srt/utils/server_args_config_parser.py), so the key stays off /proc/PID/cmdline.
    monkeypatch.setenv("MY_KEY", "sk-abc123")
    cfg = ServerConfig(engine="sglang", model="m", api_key_env="MY_KEY")
    a = adapter_for("sglang")
    argv = a.argv(cfg, run_dir=tmp_path)
    assert "sk-abc123" not in " ".join(argv) and "--api-key" not in argv
    path = argv[argv.index("--config") + 1]
    assert path == str(tmp_path / "sglang-secrets.yaml")
    assert a.private_files(cfg) == {"sglang-secrets.yaml": 'api-key: "sk-abc123"\n'}
    with pytest.raises(ValueError, match="run_dir"):
        a.argv(cfg)  # no run folder to put the key in: refused, never put on the command line
    monkeypatch.delenv("MY_KEY")
    assert "--config" not in a.argv(cfg) and a.private_files(cfg) == {}


def test_kv_capacity_from_the_vllm_log_line():
    # The format of vllm/v1/core/kv_cache_utils.py (0.32.0): "%s KV cache size: %s tokens, ..."
    log = ("INFO 11-29 [kv_cache_utils.py:1234] CPU KV cache size: 21,824 tokens, "
           "Maximum concurrency for 2,048 tokens per request: 10.66x\n")
    cfg = ServerConfig(engine="vllm", model="m")
    with SyncHttp() as client:
        assert adapter_for("vllm").kv_capacity(cfg, log_text=log, client=client) == 21824
        assert adapter_for("vllm").kv_capacity(cfg, log_text="GPU KV cache size: 376,832 tokens,",
                                               client=client) == 376832
        assert adapter_for("vllm").kv_capacity(cfg, log_text="no such line", client=client) is None


@pytest.mark.parametrize("answers", [{"/server_info"}, {"/get_server_info"}])
def test_sglang_kv_capacity_from_server_info_then_the_deprecated_endpoint(answers):
    # SGLang 0.5.23 (srt/entrypoints/http_server.py): /server_info; /get_server_info is deprecated.
    asked = []

    def handler(method, url, body, headers) -> RawResponse:
        path = urlsplit(url).path
        asked.append(path)
        if path in answers:
            return RawResponse(200, b'{"max_total_num_tokens": 376832}')
        return RawResponse(404, b"")

    cfg = ServerConfig(engine="sglang", model="m")
    with SyncHttp(transport=MockTransport(handler)) as client:
        assert adapter_for("sglang").kv_capacity(cfg, log_text="", client=client) == 376832
    assert asked[0] == "/server_info"


@pytest.mark.parametrize("line, reason", [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "out_of_memory"),
    ("OSError: [Errno 98] Address already in use", "port_in_use"),
    ("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275", "fatal_log"),
    ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nKeyError: 'boom'", "fatal_log"),
    ("llama_model_load: error loading model: tensor data is not within file bounds", "fatal_log"),
])
def test_fatal_start_up_lines(line, reason):
    kind = "llamacpp" if "llama_model_load" in line else "vllm"
    hit = first_fatal(f"INFO starting\n{line}\nmore\n", adapter_for(kind).fatal_patterns)
    assert hit is not None and hit[0].reason == reason and hit[1] == line.splitlines()[-1]


def test_ordinary_start_up_lines_are_not_fatal():
    text = ("INFO Started server process [1234]\nWARNING Using max model len 2048\n"
            "INFO Application startup complete.\nINFO: Uvicorn running on http://127.0.0.1:8000\n")
    for kind in ENGINES:
        assert first_fatal(text, adapter_for(kind).fatal_patterns) is None


@pytest.mark.parametrize(("engine", "found", "warns"), [
    ("sglang", "0.5.23", False), ("sglang", "0.5.9", False), ("sglang", "0.5.24", True),
    ("sglang", "0.6.0rc1", True), ("vllm", "0.32.0", False), ("vllm", "0.33.0", True),
    ("llamacpp", "11434 (ab12cd3)", False), ("llamacpp", "11500 (99ffee0)", True), ("vllm", None, False),
    ("transformers", "9.0.0", False),
])
def test_a_newer_engine_than_the_pin_is_a_warning(engine, found, warns):
    from harvest.engine_pins import version_warning

    warning = version_warning(engine, found)
    assert (warning is not None) is warns
    if warns:
        assert found in warning and "newer than" in warning and "docs/engines.md" in warning


def test_harvest_version_prints_the_engine_pins():
    from click.testing import CliRunner

    from harvest.cli.main import cli

    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert "sglang: sglang 0.5.23" in result.output and "vllm: vllm-cpu 0.32.0" in result.output
    assert "llamacpp: llama.cpp build 11434" in result.output
