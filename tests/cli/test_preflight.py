"""`harvest preflight CONFIG`: exit codes 0/1/2, one line per rule, --wait, --json schema."""

from __future__ import annotations

import math
import sys
import socket
import threading
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from harvest.cli.main import cli
from tests import harvest_process
from tests.gpu.schema_doc import documented_schema, only_answer, problems
from tests.capabilities import nvidia_driver

SCHEMA = documented_schema("harvest.preflight/1")
#: What the GPU rules say to set for vLLM on a machine without an NVIDIA GPU.
VLLM_CPU = ("no GPU here: for vLLM's CPU build set [server] gpus = [] and python = its Python "
            "(scripts/install-engines vllm installs it and prints the path); gpu_memory_utilization is then its "
            "share of the RAM")
# Host-dependent rules made lenient where a test is about something else.
LENIENT = "[preflight]\nmin_disk_free_gib = 0\nmax_swap_used_mib = 100000000\n"


def invoke(*args: str):
    return CliRunner().invoke(cli, ["preflight", *map(str, args)], env={"COLUMNS": "200"})


@pytest.fixture
def port():
    """A port with no server: held bound (not listening, SO_REUSEADDR) so it stays bindable."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    yield sock.getsockname()[1]
    sock.close()


@pytest.fixture
def listener():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock
    sock.close()


def config(tmp_path: Path, server: str, extra: str = LENIENT, name: str = "server.toml") -> Path:
    path = tmp_path / name
    path.write_text(f"[server]\n{server}\n{extra}\n[output]\ndir = \"out\"\n")
    return path


def cpu_server(port: int) -> str:
    return f'engine = "transformers"\nmodel = "m"\nport = {port}'


def test_clean_cpu_config_passes_with_exit_0(tmp_path, port):
    result = invoke(config(tmp_path, cpu_server(port)))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    for rule, detail in (("gpu-memory", "no GPUs listed in [server] gpus"), ("port", f"port {port} is free")):
        assert any(line.startswith("PASS") and rule in line and detail in line for line in lines), result.output
    assert "PASS: all 7 checks passed" in result.output


def test_hicache_times_tp_beyond_host_ram_fails_with_exit_1(tmp_path, port):
    available_gb = psutil.virtual_memory().available / 1e9
    size = max(48, math.ceil(available_gb / 8) + 1)  # 48 GB x 8 ranks unless this host has more RAM
    server = (f'engine = "sglang"\nmodel = "m"\nport = {port}\ntp = 8\nenable_hierarchical_cache = true\n'
              f"hicache_size = {size}")
    result = invoke(config(tmp_path, server))
    assert result.exit_code == 1, result.output
    (line,) = [line for line in result.output.splitlines() if "host-ram" in line]
    assert line.startswith("FAIL") and f"hicache_size {size} GB per rank > (available " in line
    assert "- 10 GiB SGLang reserve) // 8 rank(s)" in line
    assert "FAIL: 1 of 7 checks failed" in result.output


def test_requested_gpu_without_driver_fails(tmp_path, port):
    result = invoke(config(tmp_path, f'engine = "vllm"\nmodel = "m"\nport = {port}\ngpus = [0]'), "--json")
    doc = only_answer(result.stdout)
    details = [r["detail"] for r in doc["results"] if r["rule"] == "gpu-memory"]
    if nvidia_driver() is None:  # a GPU machine: GPU 0 is measured there, never said to be missing
        assert len(details) == 1 and "GPU 0" in details[0] and "no NVIDIA driver" not in details[0], details
        return
    assert result.exit_code == 1
    # what to set for the CPU build, where there is no GPU
    assert details == [f"GPU 0 requested but no NVIDIA driver found; {VLLM_CPU}"], details


def test_taken_port_fails_and_json_matches_the_documented_schema(tmp_path, listener):
    taken = listener.getsockname()[1]
    path = config(tmp_path, cpu_server(taken))
    result = invoke(path, "--json")
    assert result.exit_code == 1, result.output
    doc = only_answer(result.stdout)
    assert problems(doc, SCHEMA) == []
    assert doc["passed"] is False and doc["config"] == str(path) and doc["engine"] == "transformers"
    (port_result,) = [r for r in doc["results"] if r["rule"] == "port"]
    assert port_result["passed"] is False and f"port {taken} on 127.0.0.1 is in use" in port_result["detail"]
    assert port_result["numbers"]["port"] == taken


def test_wait_passes_once_the_port_is_released(tmp_path, listener):
    taken = listener.getsockname()[1]
    timer = threading.Timer(0.5, listener.close)
    timer.start()
    try:
        result = invoke(config(tmp_path, cpu_server(taken)), "--wait", "20")
    finally:
        timer.cancel()
    assert result.exit_code == 0, result.output
    (waited,) = [line for line in result.output.splitlines() if line.startswith("waited ")]
    assert waited.endswith(": passed")
    assert float(waited.split()[1]) < 20


def test_wait_times_out_and_prints_what_still_fails(tmp_path, listener):
    taken = listener.getsockname()[1]
    result = invoke(config(tmp_path, cpu_server(taken)), "--wait", "1", "--json")
    assert result.exit_code == 1
    doc = only_answer(result.stdout)
    assert problems(doc, SCHEMA) == []
    # checked again until the wait ran out (every 0.2 s, or as soon as a check that took longer ended:
    # each reads the engine's paths, and on a loaded machine one may take most of the second)
    assert doc["waited_s"] >= 1 and doc["attempts"] >= 2
    text = invoke(config(tmp_path, cpu_server(taken)), "--wait", "0.4")
    assert text.exit_code == 1
    tail = text.output[text.output.index("still failing"):]
    assert "FAIL  port" in tail and f"port {taken} on 127.0.0.1 is in use" in tail


def test_output_dir_defaults_to_the_config_and_can_be_overridden(tmp_path, port):
    path = config(tmp_path, cpu_server(port), extra="[preflight]\nmin_disk_free_gib = 1000000000\n")
    result = invoke(path)
    assert result.exit_code == 1
    (disk,) = [line for line in result.output.splitlines() if " disk " in line]
    assert disk.startswith("FAIL") and str(tmp_path / "out") in disk and "1e+09 GiB required" in disk
    other = tmp_path / "elsewhere"
    result = invoke(path, "--output-dir", other)
    (disk,) = [line for line in result.output.splitlines() if " disk " in line]
    assert str(other) in disk


def test_openai_endpoint_skips_launch_rules(tmp_path):
    result = invoke(config(tmp_path, 'engine = "openai"\nbase_url = "http://127.0.0.1:9/v1"',
                           extra="[preflight]\nmin_disk_free_gib = 0\n"))
    assert result.exit_code == 0, result.output
    skipped = [line for line in result.output.splitlines() if line.startswith("SKIP")]
    assert len(skipped) == 5 and all("does not launch" in line for line in skipped)


@pytest.mark.parametrize(("text", "expected"), [
    ('engine = "sglang"\nmodel = "m"\nmem_fraction_static = 1.5', ["bad.toml", "[server]", "mem_fraction_static"]),
    ('engine = "sglang"\nmodel = "m"\ngpus = [0]\ntp = 2', ["bad.toml", "[server]", "tp = 2"]),
])
def test_config_errors_exit_2_naming_file_table_field(tmp_path, text, expected):
    result = invoke(config(tmp_path, text, name="bad.toml"))
    assert result.exit_code == 2
    for piece in expected:
        assert piece in result.output
    assert "Traceback" not in result.output


def test_missing_file_no_server_table_and_bad_usage_exit_2(tmp_path):
    result = invoke(tmp_path / "absent.toml")
    assert result.exit_code == 2 and "absent.toml" in result.output
    no_server = tmp_path / "data-only.toml"
    no_server.write_text('[output]\ndir = "x"\n')
    result = invoke(no_server)
    assert result.exit_code == 2 and "[server]" in result.output
    assert invoke(no_server, "--wait", "-1").exit_code == 2
    assert invoke().exit_code == 2


def test_bundled_hicache_tp8_example_is_judged_against_this_machines_ram():
    """examples/sglang-hicache-tp8.toml asks 48 GB x 8 ranks of host RAM: the verdict and its numbers
    come from this machine's measured RAM (on a 24 GiB machine: refused, exit 1)."""
    import subprocess
    import sys
    from pathlib import Path

    from harvest.gpu import host_state

    example = Path(__file__).resolve().parents[2] / "examples" / "sglang-hicache-tp8.toml"
    out = harvest_process.run([sys.executable, "-m", "harvest", "preflight", str(example)], capture_output=True,
                              text=True, timeout=120)
    line = next(ln for ln in out.stdout.splitlines() if "host-ram" in ln)
    assert "hicache_size 48 GB per rank" in line and "- 10 GiB SGLang reserve) // 8 rank(s)" in line
    enough = (host_state().ram_available_mib * 2**20 - 10 * 2**30) // 8 >= 48e9
    assert line.startswith("PASS" if enough else "FAIL"), line
    failed = any(ln.startswith("FAIL ") for ln in out.stdout.splitlines())
    assert out.returncode == (1 if failed else 0), out.stdout


# --- identical findings across GPUs: one line -------------------------------------------------------


def _eight_gpu_server(port: int) -> str:
    return f'engine = "vllm"\nmodel = "m"\nport = {port}\ngpus = [0, 1, 2, 3, 4, 5, 6, 7]\ntp = 8'


def test_no_driver_on_eight_gpus_is_one_line_and_json_stays_per_gpu(tmp_path, port, monkeypatch):
    from harvest.errors import NoDriverError
    from harvest.gpu import NoGpuProbe, NvmlProbe
    from harvest.gpu.probe import NO_DRIVER
    from tests.gpu.fake_nvml import NVML_ERROR_DRIVER_NOT_LOADED, FakeNvml

    def no_driver_probe():  # what open_probe does when NVML says the driver is not loaded
        try:
            return NvmlProbe(FakeNvml([], init_error=NVML_ERROR_DRIVER_NOT_LOADED))
        except NoDriverError:
            return NoGpuProbe(NO_DRIVER)

    monkeypatch.setattr("harvest.placement.local.open_probe", no_driver_probe)
    path = config(tmp_path, _eight_gpu_server(port))
    result = invoke(path)
    assert result.exit_code == 1, result.output
    lines = [ln for ln in result.output.splitlines() if "NVIDIA driver" in ln]
    assert lines == [f"FAIL  gpu-memory, gpu-processes GPUs 0-7 requested but no NVIDIA driver found; {VLLM_CPU}"], lines
    assert "FAIL: 16 of 21 checks failed" in result.output  # the count is still per rule and GPU
    doc = only_answer(invoke(path, "--json").stdout)
    gpu_results = [r for r in doc["results"] if r["rule"] in ("gpu-memory", "gpu-processes")]
    assert len(gpu_results) == 16 and sorted({r["gpu"] for r in gpu_results}) == list(range(8))
    assert all(r["detail"] == f"GPU {r['gpu']} requested but no NVIDIA driver found; {VLLM_CPU}" for r in gpu_results)


def test_findings_that_differ_keep_their_own_lines(tmp_path, port, monkeypatch):
    from harvest.gpu import NvmlProbe
    from tests.gpu.fake_nvml import FakeNvml, h200s, unused_pid

    gpus = h200s(8)
    gpus[3].processes = [(unused_pid(), 2048)]
    gpus[3].used_mib = 2048
    monkeypatch.setattr("harvest.placement.local.open_probe",
                        lambda: NvmlProbe(FakeNvml(gpus), host_pid_namespace=True))
    result = invoke(config(tmp_path, _eight_gpu_server(port)))
    lines = result.output.splitlines()
    processes = [ln for ln in lines if "gpu-processes" in ln]
    assert len(processes) == 2, processes
    assert processes[0].startswith("PASS") and "GPUs 0-2,4-7: no compute processes" in processes[0]
    assert processes[1].startswith("FAIL") and "GPU 3: 1 foreign compute process(es)" in processes[1]
    memory = [ln for ln in lines if "gpu-memory" in ln]
    assert len(memory) == 2 and "GPUs 0-2,4-7 (NVIDIA H200): free" in memory[0] and "GPU 3 (" in memory[1]


def test_gpu_ranges():
    from harvest.cli.render import gpu_ranges

    assert gpu_ranges([0, 1, 2, 3, 4, 5, 6, 7]) == "0-7"
    assert gpu_ranges([6, 0, 1, 2, 3]) == "0-3,6"
    assert gpu_ranges([5]) == "5" and gpu_ranges([1, 3]) == "1,3"


@pytest.mark.parametrize("engine", ["vllm", "llamacpp"])
def test_every_path_the_job_names_is_checked_with_its_fix(tmp_path, port, monkeypatch, engine):
    # The file `harvest init` writes, for a machine without a GPU: its engine, its model and its
    # data are placeholders that are not there; preflight says so, each with what to do.
    monkeypatch.chdir(tmp_path)
    assert CliRunner().invoke(cli, ["init", "--engine", engine, "-o", "job.toml"]).exit_code == 0
    flags = ["--set", "server.gpus=[]", "--set", f"server.port={port}", "--set", "preflight.min_disk_free_gib=0"]
    result = invoke("job.toml", *flags, "--json")
    assert result.exit_code == 1, result.output
    (paths,) = [r for r in only_answer(result.stdout)["results"] if r["rule"] == "paths"]
    detail = paths["detail"]
    assert not paths["passed"] and paths["numbers"]["missing"] == (3 if engine == "llamacpp" else 2), detail
    if engine == "vllm":  # a hub name is the engine's to fetch: not a path
        assert "[server] python /opt/vllm-venv/bin/python does not exist: scripts/install-engines vllm" in detail
        assert "Qwen/Qwen3-8B" not in detail
    else:
        assert ("[server] command /opt/llama.cpp/build/bin/llama-server does not exist: scripts/install-engines "
                "llamacpp builds llama-server") in detail
        assert ("[server] model /models/qwen3-8b-q4_k_m.gguf does not exist: [server] model names the GGUF file "
                "llama-server loads (-m)") in detail
    assert f"[data] path {tmp_path / 'prompts.jsonl'} does not exist: give the dataset's path in [data] path or " \
           f"--data (a relative path in a job file is read from the file's folder" in detail
    # every path there: the rule passes and names them
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "hi"}\n')
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    there = ["--set", 'server.python="' + sys.executable + '"'] if engine == "vllm" else [
        "--set", f'server.command=["{sys.executable}"]', "--model", "m.gguf"]
    if engine == "vllm":  # a local folder must be a checkpoint: vLLM would fail on it after its imports
        (tmp_path / "ckpt").mkdir()
        there += ["--model", str(tmp_path / "ckpt")]
        doc = only_answer(invoke("job.toml", *flags, *there, "--json").stdout)
        (paths,) = [r for r in doc["results"] if r["rule"] == "paths"]
        assert not paths["passed"] and paths["detail"].startswith(
            f"[server] model {tmp_path / 'ckpt'} is a folder without config.json or params.json, not a model's "
            "checkpoint: [server] model names the model's folder"), paths
        (tmp_path / "ckpt" / "config.json").write_text("{}")
    doc = only_answer(invoke("job.toml", *flags, *there, "--json").stdout)
    (paths,) = [r for r in doc["results"] if r["rule"] == "paths"]
    assert paths["passed"] and paths["detail"].startswith("there: "), paths


def test_far_places_check_the_engine_there_and_the_data_is_checked_here(tmp_path, monkeypatch):
    # On [[hosts]] or a Ray cluster each place checks what the engine needs there; the dataset is
    # read on this machine by `harvest run`, so this machine says whether it is there.
    from harvest.placement.base_results import Answer, PreflightByPlace

    class FarPlaces:  # every far place passed its rules
        def preflight(self, cfg, **_):
            doc = {"passed": True, "results": [{"rule": "paths", "passed": True, "skipped": False, "gpu": None,
                                                "detail": "there: [server] python /opt/vllm/bin/python",
                                                "numbers": {}}]}
            return PreflightByPlace("ssh", "box", "host", "preflight on box", cfg.source, "vllm", (Answer("box", doc),))

    monkeypatch.setattr("harvest.cli.preflight.from_config", lambda cfg, flags: FarPlaces())
    job = config(tmp_path, 'engine = "vllm"\nmodel = "m"', extra=LENIENT + '[data]\npath = "nowhere.jsonl"\n')
    result = invoke(job)
    assert result.exit_code == 1, result.output
    assert (f"this machine: FAIL  paths          [data] path {tmp_path / 'nowhere.jsonl'} does not exist: give the "
            f"dataset's path") in result.output, result.output
    (tmp_path / "nowhere.jsonl").write_text('{"prompt": "hi"}\n')
    result = invoke(job)
    assert result.exit_code == 0 and "this machine: PASS  paths" in result.output, result.output
