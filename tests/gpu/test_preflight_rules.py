"""Preflight rules through the fake NVML backend, an injected host/disk state and real sockets."""

from __future__ import annotations

import os
import socket
import threading
import time

import psutil
import pytest

from harvest.config import PreflightConfig, ServerConfig
from harvest.gpu import NoGpuProbe, NvmlProbe, run_preflight, wait_for_preflight
from harvest.gpu.records import DiskState, HostState
from tests.gpu.fake_nvml import NVML_ERROR_GPU_IS_LOST, FakeNvml, h200s, unused_pid

GIB = 1024
IDLE_HOST = HostState(ram_total_mib=2_000_000, ram_available_mib=1_900_000, swap_total_mib=0, swap_used_mib=0)
ROOMY_DISK = DiskState(path="/", total_mib=1_000_000, free_mib=500_000)
SETTINGS = PreflightConfig()  # margin 1024 MiB, reserve 8 GiB, swap <= 1024 MiB, disk >= 10 GiB


@pytest.fixture
def listener():
    """A TCP socket this test holds listening on 127.0.0.1 (its port is taken while the test runs)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock
    sock.close()


@pytest.fixture
def free_port():
    """A port for a server that is not there: this test holds it bound, not listening, with
    SO_REUSEADDR, so it stays bindable for a server (and the check) but is not handed out to others
    as an ephemeral port while the test runs."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    yield sock.getsockname()[1]
    sock.close()


def server(free_port: int, **kw) -> ServerConfig:
    fields = {"engine": "sglang", "model": "m", "gpus": [0], "port": free_port, **kw}
    return ServerConfig(**fields)


def check(srv, probe, tmp_path, *, settings=SETTINGS, host=IDLE_HOST, disk=ROOMY_DISK, ours=()):
    return run_preflight(srv, settings, probe=probe, output_dir=tmp_path, host=host, disk=disk, ours=ours)


def only(report, rule, gpu=None):
    (res,) = [r for r in report.results if r.rule == rule and r.gpu == gpu]
    return res


def probe_for(nvml):
    return NvmlProbe(nvml, host_pid_namespace=True)


# -- gpu-memory -----------------------------------------------------------------------------------


def test_clean_machine_passes_every_rule(tmp_path, free_port):
    report = check(server(free_port, gpus=[0, 1], tp=2), probe_for(FakeNvml(h200s(2))), tmp_path)
    assert report.passed, report.failures
    assert [r.rule for r in report.results] == ["gpu-memory", "gpu-processes"] * 2 + [
        "host-ram", "swap", "port", "paths", "disk"]


def test_sglang_claim_is_mem_fraction_static_of_total_plus_activations_plus_margin(tmp_path, free_port):
    # SGLang's fraction covers weights + KV only; at tp 2 its activation floor is
    # 512 + 1.5 x 2048 + 2/8 x 1024 = 3840 MiB (0.5.23 srt/arg_groups/memory_hook.py).
    total, reserved = 143771, 615
    needed = int(0.8 * total) + 3840 + 1024
    used_ok = total - reserved - needed  # free == needed exactly: passes
    nvml = FakeNvml(h200s(2, used_mib=used_ok))
    nvml.gpus[1].used_mib = used_ok + 1  # one MiB short
    report = check(server(free_port, gpus=[0, 1], tp=2, mem_fraction_static=0.8), probe_for(nvml), tmp_path)
    ok, short = only(report, "gpu-memory", 0), only(report, "gpu-memory", 1)
    assert ok.passed and ok.numbers["needed_mib"] == needed and ok.numbers["free_mib"] == needed
    assert not short.passed
    assert f"free {needed - 1} MiB < {needed} MiB needed" in short.detail
    assert "mem_fraction_static" in short.detail and "short by 1 MiB" in short.detail


def test_sglang_default_fraction_is_computed_per_gpu_like_sglang(tmp_path, free_port):
    # SGLang 0.5.23 (memory_hook.py): reserved = max(512 + 1.5 x 2048 + tp/8 x 1024, 10 GiB on GPUs
    # over 60 GiB); mem_fraction_static = round((total - reserved) / total, 3). Was a flat 0.88.
    report = check(server(free_port), probe_for(FakeNvml(h200s(1))), tmp_path)
    res = only(report, "gpu-memory", 0)
    assert res.numbers["claim_fraction"] == round((143771 - 10240) / 143771, 3) == 0.929
    assert res.numbers["claim_mib"] == int(0.929 * 143771)
    assert res.numbers["needed_mib"] == int(0.929 * 143771) + 3712 + 1024
    assert res.passed, res.detail  # an idle H200 fits SGLang's own default


@pytest.mark.parametrize(("util", "fraction"), [(0.5, 0.5), (None, 0.92)])
def test_vllm_claim_is_gpu_memory_utilization(tmp_path, free_port, util, fraction):
    # 40% of the GPU in use: fits a 0.5 claim, not vLLM's 0.92 default (0.32.0 vllm/config/cache.py).
    nvml = FakeNvml(h200s(1, used_mib=int(0.4 * 143771)))
    srv = server(free_port, engine="vllm", gpu_memory_utilization=util)
    res = only(check(srv, probe_for(nvml), tmp_path), "gpu-memory", 0)
    assert res.numbers["claim_fraction"] == fraction
    assert res.passed is (fraction == 0.5)
    assert "gpu_memory_utilization" in res.detail


def test_other_engines_claim_the_configured_default_fraction(tmp_path, free_port):
    srv = server(free_port, engine="transformers")
    res = only(check(srv, probe_for(FakeNvml(h200s(1))), tmp_path,
                     settings=PreflightConfig(default_claim_fraction=0.25)), "gpu-memory", 0)
    assert res.numbers["claim_fraction"] == 0.25 and "default_claim_fraction" in res.detail


# -- gpu-processes --------------------------------------------------------------------------------


def test_foreign_processes_are_named_with_pid_name_and_mib(tmp_path, free_port):
    me, ghost = os.getpid(), unused_pid()
    nvml = FakeNvml(h200s(1, used_mib=42000, processes=[(me, 40960), (ghost, None)]))
    res = only(check(server(free_port), probe_for(nvml), tmp_path), "gpu-processes", 0)
    assert not res.passed
    assert f"pid {me} {psutil.Process(me).name()} 40960 MiB" in res.detail
    assert f"pid {ghost} (not visible in this pid namespace) MiB unknown" in res.detail
    assert res.numbers["foreign_count"] == 2 and res.numbers["foreign_mib"] == 40960
    assert res.numbers["foreign_unknown_mib_count"] == 1


def test_processes_harvest_started_are_not_foreign(tmp_path, free_port):
    me = os.getpid()
    nvml = FakeNvml(h200s(1, processes=[(me, 512)]))
    res = only(check(server(free_port), probe_for(nvml), tmp_path, ours={me}), "gpu-processes", 0)
    assert res.passed and f"only harvest's own processes (pids {me})" in res.detail


def test_processes_on_gpus_not_chosen_do_not_matter(tmp_path, free_port):
    nvml = FakeNvml(h200s(2))
    nvml.gpus[1].processes = [(os.getpid(), 100)]
    nvml.gpus[1].used_mib = 100
    assert check(server(free_port, gpus=[0]), probe_for(nvml), tmp_path).passed


# -- no GPUs, wrong GPUs, broken probe ------------------------------------------------------------


def test_gpus_requested_without_a_driver_fail_clearly(tmp_path, free_port):
    report = check(server(free_port, gpus=[0, 1], tp=2), NoGpuProbe(), tmp_path)
    assert not report.passed
    assert only(report, "gpu-memory", 1).detail == (
        "GPU 1 requested but no NVIDIA driver found; no GPU here: SGLang needs an NVIDIA GPU: on this machine use "
        "engine \"vllm\" (its CPU build), \"llamacpp\" or \"transformers\", with [server] gpus = []")
    assert {r.rule for r in report.failures} == {"gpu-memory", "gpu-processes"}


def test_no_gpus_requested_passes_gpu_rules_as_cpu_engine(tmp_path, free_port):
    report = check(server(free_port, engine="transformers", gpus=[]), NoGpuProbe(), tmp_path)
    assert report.passed
    assert only(report, "gpu-memory").detail == "no GPUs listed in [server] gpus"
    assert only(report, "gpu-processes").detail == "no GPUs listed in [server] gpus"


def test_gpu_index_the_machine_lacks_fails(tmp_path, free_port):
    res = only(check(server(free_port, gpus=[3]), probe_for(FakeNvml(h200s(2))), tmp_path), "gpu-memory", 3)
    assert not res.passed and "GPU 3 requested but this machine has 2 GPU(s) (indices: 0, 1)" in res.detail


def test_a_failed_measurement_is_a_failed_rule_not_a_pass(tmp_path, free_port):
    nvml = FakeNvml(h200s(1))
    nvml.fail[("nvmlDeviceGetMemoryInfo_v2", 0)] = NVML_ERROR_GPU_IS_LOST
    res = only(check(server(free_port), probe_for(nvml), tmp_path), "gpu-memory", 0)
    assert not res.passed and "measurement failed" in res.detail and "GPU is lost" in res.detail


def test_openai_endpoint_skips_launch_rules_and_says_so(tmp_path):
    srv = ServerConfig(engine="openai", base_url="http://127.0.0.1:1/v1")
    report = check(srv, NoGpuProbe(), tmp_path, host=HostState(1, 0, 100, 100))
    assert report.passed
    skipped = {r.rule for r in report.results if r.skipped}
    assert skipped == {"gpu-memory", "gpu-processes", "host-ram", "swap", "port"}
    assert all("'openai'" in r.detail and "does not launch" in r.detail for r in report.results if r.skipped)
    assert not only(report, "disk").skipped


# -- host-ram, swap, port, disk -------------------------------------------------------------------


def _host(available_mib: int, cgroup_mib: int | None = None) -> HostState:
    return HostState(ram_total_mib=2 * available_mib, ram_available_mib=available_mib, swap_total_mib=0,
                     swap_used_mib=0, cgroup_headroom_mib=cgroup_mib)


def test_hicache_size_per_rank_must_fit_sglangs_share_of_available_minus_10_gib(tmp_path, free_port):
    # SGLang 0.5.23 (srt/mem_cache/pool_host/base.py): each rank may take
    # (available - 10 GiB) // ranks_per_host; the old rule reserved 8 GiB for all ranks together.
    srv = server(free_port, engine="sglang", gpus=list(range(8)), tp=8,
                 enable_hierarchical_cache=True, hicache_size=48)
    probe = probe_for(FakeNvml(h200s(8)))
    exact_mib = -(-(48 * 10**9 * 8 + 10 * 2**30) // 2**20)  # the least MiB that leaves 48 GB per rank
    res = only(check(srv, probe, tmp_path, host=_host(exact_mib)), "host-ram")
    assert res.passed, res.detail
    assert res.numbers["budget_per_rank_bytes"] == (exact_mib * 2**20 - 10 * 2**30) // 8 >= 48 * 10**9
    # 9 GiB short of that in all (but more than the 8 GiB the old rule kept): fails, saying why.
    res = only(check(srv, probe, tmp_path, host=_host(exact_mib - 9 * 1024)), "host-ram")
    assert not res.passed
    assert res.detail.startswith("hicache_size 48 GB per rank > (available ")
    assert "- 10 GiB SGLang reserve) // 8 rank(s)" in res.detail and "Not enough host memory available" in res.detail


def test_hicache_budget_is_bounded_by_the_memory_cgroup(tmp_path, free_port):
    srv = server(free_port, engine="sglang", gpus=[0], enable_hierarchical_cache=True, hicache_size=20)
    probe = probe_for(FakeNvml(h200s(1)))
    assert only(check(srv, probe, tmp_path, host=_host(100_000)), "host-ram").passed
    res = only(check(srv, probe, tmp_path, host=_host(100_000, cgroup_mib=20_000)), "host-ram")
    assert not res.passed and "cgroup-bounded" in res.detail


def test_hicache_without_size_is_sized_by_sglang_within_08_of_the_budget(tmp_path, free_port):
    srv = server(free_port, engine="sglang", gpus=[0, 1], tp=2, enable_hierarchical_cache=True)
    res = only(check(srv, probe_for(FakeNvml(h200s(2))), tmp_path, host=_host(200_000)), "host-ram")
    budget = (200_000 * 2**20 - 10 * 2**30) // 2
    assert res.passed and res.numbers["pool_per_rank_bytes"] == int(0.8 * budget)
    assert "2 x the device KV pool" in res.detail


def test_vllm_cpu_kv_cache_lives_in_host_ram(tmp_path, free_port):
    # 0.32.0 vllm/v1/worker/cpu_worker.py: without VLLM_CPU_KVCACHE_SPACE it reserves
    # gpu_memory_utilization (default 0.92) x RAM and refuses to start when less is available.
    cpu = server(free_port, engine="vllm", gpus=[])
    host = HostState(ram_total_mib=10_000, ram_available_mib=7_000, swap_total_mib=0, swap_used_mib=0)
    res = only(check(cpu, NoGpuProbe(), tmp_path, host=host), "host-ram")
    assert not res.passed and res.numbers["needed_mib"] == 9200 and "0.92 x 10000 MiB" in res.detail
    half = server(free_port, engine="vllm", gpus=[], gpu_memory_utilization=0.5)
    assert only(check(half, NoGpuProbe(), tmp_path, host=host), "host-ram").passed
    spaced = server(free_port, engine="vllm", gpus=[], env={"VLLM_CPU_KVCACHE_SPACE": "4"})
    res = only(check(spaced, NoGpuProbe(), tmp_path, host=host), "host-ram")
    assert not res.passed and res.numbers["needed_mib"] == (4 + 8) * 1024  # + [preflight] ram_reserve_gib
    assert only(check(spaced, NoGpuProbe(), tmp_path, host=host,
                      settings=PreflightConfig(ram_reserve_gib=2)), "host-ram").passed


def test_hicache_off_needs_no_host_pool(tmp_path, free_port):
    host = HostState(ram_total_mib=1000, ram_available_mib=10, swap_total_mib=0, swap_used_mib=0)
    res = only(check(server(free_port), probe_for(FakeNvml(h200s(1))), tmp_path, host=host), "host-ram")
    assert res.passed and "hierarchical cache off" in res.detail


def test_swap_in_use_fails(tmp_path, free_port):
    probe = probe_for(FakeNvml(h200s(1)))
    host = HostState(ram_total_mib=100_000, ram_available_mib=90_000, swap_total_mib=8192, swap_used_mib=2048)
    res = only(check(server(free_port), probe, tmp_path, host=host), "swap")
    assert not res.passed and res.detail == "swap used 2048 MiB > 1024 MiB allowed (swap total 8192 MiB)"
    relaxed = PreflightConfig(max_swap_used_mib=4096)
    assert only(check(server(free_port), probe, tmp_path, host=host, settings=relaxed), "swap").passed


def test_port_held_by_a_test_socket_fails_and_names_the_holder(tmp_path, listener):
    port = listener.getsockname()[1]
    res = only(check(server(port), probe_for(FakeNvml(h200s(1))), tmp_path), "port")
    assert not res.passed
    assert f"port {port} on 127.0.0.1 is in use" in res.detail
    assert f"pid {os.getpid()}" in res.detail


def test_port_free_passes(tmp_path, free_port):
    res = only(check(server(free_port), probe_for(FakeNvml(h200s(1))), tmp_path), "port")
    assert res.passed and res.detail == f"port {free_port} is free on 127.0.0.1"


def test_disk_threshold(tmp_path, free_port):
    probe = probe_for(FakeNvml(h200s(1)))
    small = DiskState(path=str(tmp_path), total_mib=100 * GIB, free_mib=5 * GIB)
    res = only(check(server(free_port), probe, tmp_path, disk=small), "disk")
    assert not res.passed and "free 5.0 GiB < 10 GiB required" in res.detail and str(tmp_path) in res.detail
    assert only(check(server(free_port), probe, tmp_path, disk=small,
                      settings=PreflightConfig(min_disk_free_gib=4)), "disk").passed


def test_disk_is_measured_on_the_nearest_existing_folder(tmp_path, free_port):
    report = run_preflight(server(free_port), SETTINGS, probe=probe_for(FakeNvml(h200s(1))),
                           output_dir=tmp_path / "not" / "yet", host=IDLE_HOST)
    res = only(report, "disk")
    assert f"(file system of {tmp_path})" in res.detail
    assert res.numbers["free_mib"] > 0


# -- waiting --------------------------------------------------------------------------------------


def test_wait_passes_once_the_foreign_process_exits(tmp_path, free_port):
    nvml = FakeNvml(h200s(1, used_mib=40960 + 200, processes=[(os.getpid(), 40960)]))

    def holder_exits():
        nvml.gpus[0].processes = []
        nvml.gpus[0].used_mib = 0

    timer = threading.Timer(0.6, holder_exits)
    timer.start()
    try:
        start = time.monotonic()
        report = wait_for_preflight(server(free_port), SETTINGS, probe=probe_for(nvml), output_dir=tmp_path,
                                    wait_s=20, host=IDLE_HOST, disk=ROOMY_DISK)
        took = time.monotonic() - start
    finally:
        timer.cancel()
    assert report.passed
    assert 0.5 < took < 10 and report.attempts >= 3


def test_wait_polls_at_5_hz_and_reports_what_still_fails(tmp_path, listener):
    port = listener.getsockname()[1]
    now = [0.0]
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:  # a clock that only moves when the poller sleeps
        sleeps.append(seconds)
        now[0] += seconds

    report = wait_for_preflight(server(port), SETTINGS, probe=probe_for(FakeNvml(h200s(1))),
                                output_dir=tmp_path, wait_s=1.0, host=IDLE_HOST, disk=ROOMY_DISK,
                                clock=lambda: now[0], sleep=sleep)
    assert not report.passed and [r.rule for r in report.failures] == ["port"]
    assert report.waited_s == pytest.approx(1.0)
    assert report.attempts == 6  # t = 0, 0.2, ..., 1.0
    assert max(sleeps) <= 0.2 + 1e-9


def test_wait_refuses_slow_polling(tmp_path, free_port):
    with pytest.raises(ValueError):
        wait_for_preflight(server(free_port), SETTINGS, probe=NoGpuProbe(), output_dir=tmp_path, wait_s=1,
                           interval_s=0.5)
