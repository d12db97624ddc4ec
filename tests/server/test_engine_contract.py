"""Contract tests: harvest's argv for a table of configs, parsed by each engine's own argument parser.

SGLang: ``ServerArgs.add_cli_args`` of the released 0.5.23 wheel (``--config`` merged by its own
``ConfigArgumentMerger``); vLLM: ``make_arg_parser`` of the installed CPU build 0.32.0 (what
``python -m vllm.entrypoints.launchers.api_server.entry`` parses). Each engine's parser runs once,
in the engine's Python over the whole table (a fork of the session's host that imported the parser:
tests/engine_parsers.py); nothing of the parsers is mocked.
Accepted configs must parse to the values harvest meant; configs the engines would refuse are
refused by harvest when the config loads. The host-pool test runs SGLang's own budget function,
compiled from the installed wheel's source.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from harvest.config import ServerConfig, parse_config
from harvest.engine_pins import SGLANG_KV_DTYPES, VLLM_KV_DTYPES
from harvest.errors import ConfigError
from harvest.server.base import adapter_for, private_files
from tests.engine_parsers import ParserHosts

# Each engine's own argument parser, run in the engine's environment.
pytestmark = pytest.mark.engine

#: Runs in the engine's Python: reads [argv, ...] as JSON on stdin, prints one result per argv.
SGLANG_PARSE = textwrap.dedent("""
    import argparse, contextlib, io, json, sys
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger
    out = []
    for argv in json.load(sys.stdin):
        parser = argparse.ArgumentParser(prog="sglang serve")
        ServerArgs.add_cli_args(parser)
        err = io.StringIO()
        try:
            if "--config" in argv:
                argv = ConfigArgumentMerger(parser).merge_config_with_args(argv)
            with contextlib.redirect_stderr(err):
                ns = parser.parse_args(argv)
            out.append({"ok": {k: v for k, v in vars(ns).items()
                               if isinstance(v, (str, int, float, bool, type(None)))}})
        except SystemExit:
            out.append({"error": err.getvalue()})
    kv = [a.choices for a in parser._actions if "--kv-cache-dtype" in a.option_strings][0]
    print("RESULT " + json.dumps({"results": out, "kv_choices": list(kv)}))
""")

VLLM_PARSE = textwrap.dedent("""
    import contextlib, io, json, sys
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    out = []
    for argv in json.load(sys.stdin):
        parser = make_arg_parser(FlexibleArgumentParser())
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ns = parser.parse_args(argv)
            out.append({"ok": {k: v for k, v in vars(ns).items()
                               if isinstance(v, (str, int, float, bool, list, type(None)))}})
        except SystemExit:
            out.append({"error": err.getvalue()})
    kv = [a.choices for a in parser._actions if "--kv-cache-dtype" in a.option_strings][0]
    import importlib.util
    entry = importlib.util.find_spec("vllm.entrypoints.launchers.api_server.entry") is not None
    print("RESULT " + json.dumps({"results": out, "kv_choices": list(kv), "entry_module": entry}))
""")


def parse_with(hosts: ParserHosts, engine: str, python: str, code: str, argvs: list[list[str]]) -> dict:
    proc = hosts.run(engine, python, code, stdin=json.dumps(argvs), timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"parser run failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


# -- the table: (config fields, what the engine's parser must hold) -------------------------------

GPUS8 = {"gpus": list(range(8)), "tp": 8}
SGLANG_TABLE: list[tuple[dict, dict]] = [
    ({}, {"model_path": "/m/qwen", "tp_size": 1, "enable_metrics": True, "kv_cache_dtype": "auto",
          "enable_hierarchical_cache": False, "hicache_size": 0, "api_key": None, "reasoning_parser": None}),
    ({**GPUS8, "served_model_name": "qwen", "mem_fraction_static": 0.85, "kv_cache_dtype": "fp8_e4m3",
      "enable_hierarchical_cache": True, "hicache_size": 48, "max_running_requests": 256, "dtype": "bfloat16",
      "reasoning_parser": "qwen3", "port": 30001, "host": "127.0.0.2"},
     {"tp_size": 8, "served_model_name": "qwen", "mem_fraction_static": 0.85, "kv_cache_dtype": "fp8_e4m3",
      "enable_hierarchical_cache": True, "hicache_size": 48, "hicache_ratio": None,
      "max_running_requests": 256,
      "dtype": "bfloat16", "reasoning_parser": "qwen3", "port": 30001, "host": "127.0.0.2"}),
    ({"enable_hierarchical_cache": True, "hicache_ratio": 2.5},
     {"enable_hierarchical_cache": True, "hicache_ratio": 2.5, "hicache_size": 0}),
    ({"enable_hierarchical_cache": True}, {"enable_hierarchical_cache": True, "hicache_size": 0,
                                           "hicache_ratio": None}),
    ({"hicache_size": 16}, {"enable_hierarchical_cache": False}),  # hicache off: the size is not passed
    *[({"kv_cache_dtype": d}, {"kv_cache_dtype": d}) for d in SGLANG_KV_DTYPES],
]
VLLM_TABLE: list[tuple[dict, dict]] = [
    ({}, {"model": "/m/qwen", "tensor_parallel_size": 1, "kv_cache_dtype": "auto", "api_key": None,
          "reasoning_parser": ""}),  # vLLM 0.32.0's default: "" (no parser)
    ({**GPUS8, "served_model_name": "qwen", "gpu_memory_utilization": 0.85, "kv_cache_dtype": "fp8",
      "max_running_requests": 128, "dtype": "bfloat16", "reasoning_parser": "qwen3", "port": 8123},
     {"tensor_parallel_size": 8, "served_model_name": ["qwen"], "gpu_memory_utilization": 0.85,
      "kv_cache_dtype": "fp8", "max_num_seqs": 128, "dtype": "bfloat16", "reasoning_parser": "qwen3",
      "port": 8123, "host": "127.0.0.1"}),
    *[({"kv_cache_dtype": d}, {"kv_cache_dtype": d}) for d in VLLM_KV_DTYPES],
]

#: Values the engines refuse (exit 2 from their parsers): harvest refuses them at load, naming why.
REFUSED = [
    ("sglang", {"kv_cache_dtype": "fp8"}, "fp8 is not an SGLang KV dtype", ["--kv-cache-dtype", "fp8"]),
    ("sglang", {"enable_hierarchical_cache": True, "hicache_size": 12.5}, "whole number of GB",
     ["--enable-hierarchical-cache", "--hicache-size", "12.5"]),
    ("vllm", {"kv_cache_dtype": "bf16"}, "bf16 is not a vLLM KV dtype", ["--kv-cache-dtype", "bf16"]),
    ("vllm", {"kv_cache_dtype": "fp8_e4m3fn"}, "vLLM accepts auto, float16",
     ["--kv-cache-dtype", "fp8_e4m3fn"]),
]


def _argv(engine: str, fields: dict, run_dir: Path | None = None) -> list[str]:
    cfg = ServerConfig(engine=engine, model="/m/qwen", python="py", **fields)
    return adapter_for(engine).argv(cfg, run_dir=run_dir)[3:]  # without "py -m MODULE"


def _check_table(parsed: dict, table: list[tuple[dict, dict]]) -> None:
    for (fields, want), result in zip(table, parsed["results"]):
        assert "ok" in result, f"{fields}: the engine refused harvest's argv: {result.get('error')}"
        got = {k: result["ok"].get(k, "<absent>") for k in want}
        assert got == want, f"{fields}: parsed {got}, harvest meant {want}"


def test_sglang_parses_harvests_argv_to_the_values_meant(sglang_python, parser_hosts, tmp_path, monkeypatch):
    monkeypatch.setenv("HARVEST_TEST_KEY", "sk-contract-1")
    keyed = ServerConfig(engine="sglang", model="/m/qwen", python="py", api_key_env="HARVEST_TEST_KEY")
    for name, text in private_files(adapter_for("sglang"), keyed).items():
        (tmp_path / name).write_text(text)
    keyed_argv = adapter_for("sglang").argv(keyed, run_dir=tmp_path)[3:]
    assert "sk-contract-1" not in " ".join(keyed_argv)  # off /proc/PID/cmdline
    rejected = [["--model-path", "m", *extra] for (engine, _, _, extra) in REFUSED if engine == "sglang"]
    argvs = [_argv("sglang", fields) for fields, _ in SGLANG_TABLE] + [keyed_argv] + rejected
    parsed = parse_with(parser_hosts, "sglang", sglang_python, SGLANG_PARSE, argvs)
    _check_table(parsed, SGLANG_TABLE)
    key_result = parsed["results"][len(SGLANG_TABLE)]
    assert key_result["ok"]["api_key"] == "sk-contract-1"  # read from the --config file by SGLang itself
    errors = [r.get("error", "") for r in parsed["results"][len(SGLANG_TABLE) + 1:]]
    assert "invalid choice: 'fp8'" in errors[0] and "invalid int value: '12.5'" in errors[1], errors
    assert tuple(parsed["kv_choices"]) == SGLANG_KV_DTYPES  # the pinned set is SGLang's own


def test_vllm_parses_harvests_argv_to_the_values_meant(vllm_python, parser_hosts, monkeypatch):
    monkeypatch.setenv("HARVEST_TEST_KEY", "sk-contract-2")
    keyed = _argv("vllm", {"api_key_env": "HARVEST_TEST_KEY"})
    assert "sk-contract-2" not in " ".join(keyed)  # the key goes through VLLM_API_KEY
    rejected = [["--model", "m", *extra] for (engine, _, _, extra) in REFUSED if engine == "vllm"]
    argvs = [_argv("vllm", fields) for fields, _ in VLLM_TABLE] + rejected
    parsed = parse_with(parser_hosts, "vllm", vllm_python, VLLM_PARSE, argvs)
    _check_table(parsed, VLLM_TABLE)
    errors = [r.get("error", "") for r in parsed["results"][len(VLLM_TABLE):]]
    assert all("invalid choice" in e for e in errors), errors
    assert sorted(parsed["kv_choices"]) == sorted(VLLM_KV_DTYPES)
    assert parsed["entry_module"], "vllm.entrypoints.launchers.api_server.entry is gone from this vLLM"


@pytest.mark.parametrize(("engine", "fields", "message", "_engine_argv"), REFUSED)
def test_values_the_engines_refuse_are_refused_at_config_load(engine, fields, message, _engine_argv):
    with pytest.raises(ConfigError) as info:
        parse_config({"server": {"engine": engine, "model": "m", **fields}}, source="job.toml")
    text = str(info.value)
    assert message in text and "job.toml [server]" in text, text


def _sglang_budget_function(sglang_python: str, available_bytes: int, ranks: int):
    """SGLang 0.5.23's own ``host_memory_budget_bytes`` and reserve constant, compiled from the
    installed wheel's ``srt/mem_cache/pool_host/base.py`` with the host probes replaced by fakes
    (importing that module needs SGLang's CUDA stack; the function itself is plain arithmetic)."""
    import ast
    from contextvars import ContextVar

    code = "import importlib.util as u; print(u.find_spec('sglang').submodule_search_locations[0])"
    where = subprocess.run([sglang_python, "-c", code], capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr
    source = Path(where.stdout.strip(), "srt", "mem_cache", "pool_host", "base.py").read_text()
    wanted = {"host_memory_budget_bytes", "HICACHE_HOST_MEMORY_RESERVE_BYTES"}
    nodes = [n for n in ast.parse(source).body
             if (isinstance(n, ast.FunctionDef) and n.name in wanted)
             or (isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id in wanted)]
    assert len(nodes) == 2, "SGLang moved its host-pool arithmetic: re-read base.py"
    namespace = {
        "available_host_memory_bytes": lambda **kw: available_bytes,  # the fake host-memory probe
        "ranks_per_host": lambda: ranks,
        "_host_memory_budget": ContextVar("budget", default=None),
        "Optional": object,
    }
    # SGLang's own code, on purpose:
    exec(compile(ast.Module(body=nodes, type_ignores=[]), "sglang/srt/mem_cache/pool_host/base.py", "exec"),  # noqa: S102
         namespace)
    assert namespace["HICACHE_HOST_MEMORY_RESERVE_BYTES"] == 10 * 2**30
    return namespace["host_memory_budget_bytes"]


def test_sglang_host_pool_budget_is_sglangs_own_arithmetic(sglang_python, tmp_path):
    """Acceptance 3: examples/sglang-hicache-tp8.toml on a host with 500 GB available and 8 ranks:
    preflight's per-rank budget equals what SGLang 0.5.23's own ``host_memory_budget_bytes``
    (srt/mem_cache/pool_host/base.py) computes from the same measurement."""
    from harvest.config import load_config
    from harvest.gpu import NoGpuProbe, run_preflight
    from harvest.gpu.preflight import sglang_rank_budget_bytes
    from harvest.gpu.records import DiskState, HostState

    example = Path(__file__).resolve().parents[2] / "examples" / "sglang-hicache-tp8.toml"
    cfg = load_config(example)
    server = cfg.require_server().model_copy(update={"gpus": []})  # no GPU here: only the host rule
    host = HostState(ram_total_mib=600_000, ram_available_mib=500 * 10**9 // 2**20, swap_total_mib=0,
                     swap_used_mib=0)
    budget_of = _sglang_budget_function(sglang_python, host.ram_available_mib * 2**20, ranks=8)
    sglang_budget = budget_of(48 * 10**9)
    assert sglang_rank_budget_bytes(host, 8) == sglang_budget
    report = run_preflight(server, cfg.preflight, probe=NoGpuProbe(), output_dir=tmp_path, host=host,
                           disk=DiskState(path="/", total_mib=10**6, free_mib=10**6))
    ram = next(r for r in report.results if r.rule == "host-ram")
    assert ram.numbers["budget_per_rank_bytes"] == sglang_budget and ram.numbers["ranks"] == 8
    assert ram.passed and 48 * 10**9 <= sglang_budget, ram.detail  # 48 GB per rank fits 500 GB
    # 390 GB available: 48 GB x 8 + 10 GiB no longer fits, for SGLang and for preflight alike.
    small = HostState(ram_total_mib=600_000, ram_available_mib=390 * 10**9 // 2**20, swap_total_mib=0,
                      swap_used_mib=0)
    small_of = _sglang_budget_function(sglang_python, small.ram_available_mib * 2**20, ranks=8)
    small_budget = small_of(48 * 10**9)
    assert small_budget < 48 * 10**9 and sglang_rank_budget_bytes(small, 8) == small_budget
    report = run_preflight(server, cfg.preflight, probe=NoGpuProbe(), output_dir=tmp_path, host=small,
                           disk=DiskState(path="/", total_mib=10**6, free_mib=10**6))
    assert not next(r for r in report.results if r.rule == "host-ram").passed


@pytest.mark.parametrize(("engine", "grid", "message"), [
    ("sglang", {"kv_cache_dtype": ["auto", "fp8"]}, "fp8 is not an SGLang KV dtype"),
    ("sglang", {"enable_hierarchical_cache": [True], "hicache_size": [12.5, 48]}, "whole number of GB"),
    ("llamacpp", {"kv_cache_dtype": ["f16", "fp8_e4m3"]}, "llama.cpp has no FP8 cache type"),
])
def test_a_tune_grid_with_a_value_the_engine_refuses_is_refused_before_any_launch(engine, grid, message):
    # Before: the trial launched and showed up as "the engine exited" (SGLang's parser exits with 2).
    from harvest.campaign.sweep.tune import expand_grid
    from harvest.campaign.sweep.tune_file import parse_tune_file

    base = ServerConfig(engine=engine, model="m")
    with pytest.raises(ConfigError) as info:
        expand_grid(base, parse_tune_file({"grid": [grid]}, source="tune.toml"))
    assert message in str(info.value) and "tune.toml [grid]" in str(info.value)
