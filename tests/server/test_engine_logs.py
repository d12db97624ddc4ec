"""Fatal log lines and KV-capacity lines as the engines print them, at the pinned versions.

Each line below is the engine's own message (the f-string of the named file, with example values),
and ``test_*_source_still_has_*`` checks, in the installed engines, that the fixed text the patterns
rely on is still in that file.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harvest import http
from harvest.config import ServerConfig
from harvest.http import SyncHttp
from harvest.server.base import COMMON_FATAL, adapter_for
from harvest.server.readiness import first_fatal

# SGLang 0.5.23, srt/model_executor/pool_configurator.py
SGLANG_NO_KV_ROOM = ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
                     "Current value: mem_fraction_static=0.95")
# SGLang 0.5.23, srt/mem_cache/pool_host/base.py (HostKVCache._allocate_host_buffer)
SGLANG_NO_HOST_ROOM = ("ValueError: Not enough host memory available. Requesting 48.00 GB but only have "
                       "36.71 GB free. Please reduce the size of the hierarchical cache.")
# SGLang 0.5.23, srt/entrypoints/engine.py (_scheduler_died_error)
SGLANG_RANK_DIED = ("RuntimeError: Rank 3 scheduler died during initialization (exit code: -9). If exit code "
                    "is -9 (SIGKILL), a common cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check.")
# SGLang 0.5.23, srt/managers/scheduler.py, logged with configure_logger's "[%(asctime)s TP3] %(message)s"
SGLANG_TP_PREFIXED = "[2026-12-01 02:00:00 TP3] Scheduler hit an exception: Traceback (most recent call last):"
SGLANG_TP_PREFIXED_ERROR = "[2026-12-01 02:00:00 TP3] RuntimeError: CUDA error: an illegal memory access"

# vLLM 0.32.0, vllm/v1/core/kv_cache_utils.py (_check_enough_kv_cache_memory)
VLLM_MAX_SEQ_LEN = ("ValueError: To serve at least one request with the model's max seq len (32768), "
                    "(4.0 GiB KV cache is needed, which is larger than the available KV cache memory (1.0 GiB). "
                    "Based on the available memory, the estimated maximum model length is 8192.")
VLLM_NO_BLOCKS = "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`"
# vLLM 0.32.0, vllm/v1/worker/cpu_worker.py (CPUWorker.__init__), as seen on this machine
VLLM_CPU_NODE = ("ValueError: Available memory on node 0 (7.46/10.21 GiB) on startup is less than desired CPU "
                 "memory utilization (0.92, 9.4 GiB). On the CPU backend, the `--gpu-memory-utilization` flag "
                 "controls the fraction of CPU memory reserved (despite its name).")

# llama.cpp build 11434, tools/server/server-context.cpp (load_model): without --parallel
LLAMA_UNIFIED = "srv    load_model: initializing, n_slots = 4, n_ctx_slot = 4096, kv_unified = 'true'"
LLAMA_SPLIT = "srv    load_model: initializing, n_slots = 2, n_ctx_slot = 2048, kv_unified = 'false'"


def _traceback(last: str, prefix: str = "") -> str:
    return "\n".join(prefix + line for line in (
        "Traceback (most recent call last):", '  File "/venv/x.py", line 84, in __init__',
        "    raise ValueError(", last)) + "\n"


@pytest.mark.parametrize(("engine", "line", "reason"), [
    ("sglang", SGLANG_NO_KV_ROOM, "out_of_memory"),
    ("sglang", SGLANG_NO_HOST_ROOM, "out_of_memory"),
    ("sglang", SGLANG_RANK_DIED, "fatal_log"),
    ("sglang", SGLANG_TP_PREFIXED_ERROR, "fatal_log"),
    ("vllm", VLLM_MAX_SEQ_LEN, "out_of_memory"),
    ("vllm", VLLM_NO_BLOCKS, "out_of_memory"),
    ("vllm", VLLM_CPU_NODE, "out_of_memory"),
])
def test_engine_lines_at_the_pinned_versions_are_classified(engine, line, reason):
    hit = first_fatal(f"INFO starting\n{line}\n", adapter_for(engine).fatal_patterns)
    assert hit is not None and hit[0].reason == reason and hit[1] == line


@pytest.mark.parametrize(("engine", "last", "reason", "prefix"), [
    ("vllm", VLLM_CPU_NODE, "out_of_memory", "(EngineCore_DP0 pid=4242) "),
    ("vllm", VLLM_MAX_SEQ_LEN, "out_of_memory", ""),
    ("sglang", SGLANG_NO_HOST_ROOM, "out_of_memory", ""),
])
def test_the_cause_wins_over_the_traceback_that_carries_it(engine, last, reason, prefix):
    # The shared ^Traceback pattern used to be tried first: these ended as "a Python traceback".
    hit = first_fatal(_traceback(last, prefix), adapter_for(engine).fatal_patterns)
    assert hit is not None and hit[0].reason == reason and hit[1].endswith(last)


def test_a_bare_traceback_is_reported_by_its_exception_line():
    hit = first_fatal(_traceback("KeyError: 'rope_scaling'"), adapter_for("vllm").fatal_patterns)
    assert hit is not None and hit[0] in COMMON_FATAL and hit[1] == "KeyError: 'rope_scaling'"
    # The exception line may not have been written yet: the header is reported.
    hit = first_fatal("Traceback (most recent call last):\n", adapter_for("vllm").fatal_patterns)
    assert hit is not None and hit[1] == "Traceback (most recent call last):"


def test_sglang_scheduler_lines_with_the_tp_prefix():
    hit = first_fatal(SGLANG_TP_PREFIXED + "\n" + _traceback("RuntimeError: boom"),
                      adapter_for("sglang").fatal_patterns)
    assert hit is not None and hit[0].description == "an SGLang scheduler died" and hit[1] == "RuntimeError: boom"


def test_llamacpp_unified_kv_cache_is_not_multiplied_by_the_slots():
    a = adapter_for("llamacpp")
    cfg = ServerConfig(engine="llamacpp", model="m.gguf")
    with SyncHttp() as client:
        assert a.kv_capacity(cfg, log_text=LLAMA_UNIFIED + "\n", client=client) == 4096
        assert a.kv_capacity(cfg, log_text=LLAMA_SPLIT + "\n", client=client) == 4096


# -- the fixed texts above are still in the installed engines' sources ----------------------------


def _package_dir(python: str, package: str) -> Path:
    code = f"import importlib.util as u; print(u.find_spec({package!r}).submodule_search_locations[0])"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return Path(out.stdout.strip())


@pytest.mark.parametrize(("path", "text"), [
    ("srt/model_executor/pool_configurator.py", "Not enough memory. Please try to increase --mem-fraction-static."),
    ("srt/mem_cache/pool_host/base.py", "Not enough host memory available. Requesting "),
    ("srt/entrypoints/engine.py", 'f"Rank {rank} scheduler died during initialization "'),
    ("srt/managers/scheduler.py", 'logger.error(f"Scheduler hit an exception: {traceback}")'),
    ("srt/managers/scheduler.py", 'prefix += f" TP{shown_tp}"'),
    ("srt/utils/common.py", 'format = f"[%(asctime)s{maybe_ms}{prefix}] %(message)s"'),
    ("srt/entrypoints/http_server.py", '@app.get("/server_info")'),
    ("srt/mem_cache/pool_host/base.py", "HICACHE_HOST_MEMORY_RESERVE_BYTES: int = 10 * (1024**3)"),
    # what an endpoint's capacity is read from (client/capacity.py): /server_info's internal states,
    # one per data-parallel rank, with what each rank's scheduler runs at once
    ("srt/entrypoints/http_server.py", '"internal_states": internal_states,'),
    ("srt/managers/scheduler_components/internal_state.py",
     'state["effective_max_running_requests_per_dp"] = scheduler.max_running_requests'),
    ("srt/managers/scheduler.py", '"max_total_num_tokens": self.max_total_num_tokens,'),
])
def test_sglang_source_still_has_the_text(sglang_python, path, text):
    assert text in (_package_dir(sglang_python, "sglang") / path).read_text()


@pytest.mark.parametrize(("path", "text"), [
    ("v1/core/kv_cache_utils.py", 'f"To serve at least one request with the model\'s max seq len "'),
    ("v1/core/kv_cache_utils.py", '"No available memory for the cache blocks. "'),
    ("v1/worker/cpu_worker.py", 'f"Available memory on node {cpu_core.numa_node} "'),
    ("v1/worker/cpu_worker.py", '"is less than desired CPU memory utilization "'),
    ("config/cache.py", "gpu_memory_utilization: float = Field(default=0.92, gt=0, le=1)"),
    # an endpoint's capacity (client/capacity.py): the cache config as labels of an info gauge, and
    # the whole config (max_num_seqs in scheduler_config) only on the development-mode /server_info
    ("v1/metrics/loggers.py", 'name = "vllm:cache_config_info"'),
    ("config/cache.py", "return {key: str(value) for key, value in self.__dict__.items()}"),
    ("entrypoints/serve/dev/server_info/api_router.py",
     'else PydanticVllmConfig.dump_python(vllm_config, mode="json", fallback=str)'),
    ("config/vllm.py", "scheduler_config: SchedulerConfig = Field("),
])
def test_vllm_source_still_has_the_text(vllm_python, path, text):
    assert text in (_package_dir(vllm_python, "vllm") / path).read_text()


@pytest.mark.engine
def test_llama_server_without_parallel_reports_its_whole_context_once(llama_server_bin, tiny_gguf, launcher):
    # Real llama-server: without --parallel it picks 4 slots sharing one unified KV cache of -c tokens.
    def config(port: int) -> ServerConfig:
        return ServerConfig(engine="llamacpp", model=str(tiny_gguf), command=[llama_server_bin], port=port,
                            extra_args=["--threads", "1", "-c", "2048"], ready_timeout=120.0, stop_grace=3.0,
                            stop_deadline=12.0)

    server = launcher.launch(config)
    props = http.get(server.url + "/props", timeout=10).json()
    assert props["total_slots"] == 4 and props["default_generation_settings"]["n_ctx"] == 2048, props
    assert server.kv_capacity_tokens == 2048  # not 4 x 2048


def test_sglang_tp_prefixed_warnings_that_mention_errors_are_not_fatal():
    # SGLang 0.5.23 srt/models/registry.py: logger.warning(f"Ignore import error when loading {name}: {e}")
    line = ("[2026-12-01 02:00:00 TP1] Ignore import error when loading sglang.srt.models.foo: "
            "ModuleNotFoundError No module named 'foo'")
    assert first_fatal(line + "\n", adapter_for("sglang").fatal_patterns) is None
