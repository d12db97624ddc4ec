"""Preflight: is it safe to launch this server config on this machine now, and if not, why not.

One :class:`~harvest.checks.RuleResult` per rule (per chosen GPU for the GPU rules), each with the
measured numbers in its detail text and in ``numbers`` (the records live in :mod:`harvest.checks`,
re-exported here and by :mod:`harvest.gpu`):

    gpu-memory      free MiB >= what the engine will claim (fraction x total, plus SGLang's
                    activations on top) + margin
    gpu-processes   no compute processes on the chosen GPUs other than harvest's own (``ours``)
    host-ram        SGLang's host KV pool fits the way SGLang 0.5.23 sizes it: each of the tp ranks
                    gets (available - 10 GiB) // tp, available bounded by the memory cgroup;
                    vLLM's CPU build: its KV cache (host RAM) fits
    swap            swap used <= max_swap_used_mib
    port            the server's port can be bound on its bind address
    paths           every path the job names is there (gpu/paths.py): the engine's Python or binary,
                    a local model file or folder, the data
    disk            the output folder's file system has min_disk_free_gib free

Everything is measured at call time through the probe, psutil and a bind check. This module never
starts, signals or waits for a process beyond its own polling deadline, and never turns a failed
measurement into a pass: a probe error is a failed rule that carries the error.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from pathlib import Path

import psutil

from harvest.checks import NamedPath, Number, PreflightReport, RuleResult
from harvest.config import PreflightConfig, ServerConfig
from harvest.errors import ProbeError
from harvest.gpu.host import disk_state, host_state
from harvest.gpu.paths import PATHS, cpu_hint, paths_rule
from harvest.gpu.records import DiskState, GpuProbe, GpuProcess, GpuState, HostState
from harvest.net import listening_pids, port_bindable, port_listening

GPU_MEMORY = "gpu-memory"
GPU_PROCESSES = "gpu-processes"
HOST_RAM = "host-ram"
SWAP = "swap"
PORT = "port"
DISK = "disk"
RULES = (GPU_MEMORY, GPU_PROCESSES, HOST_RAM, SWAP, PORT, PATHS, DISK)

#: vLLM's ``gpu_memory_utilization`` default (0.32.0 ``vllm/config/cache.py``); on the CPU build the
#: same fraction of the NUMA node's RAM.
VLLM_DEFAULT_FRACTION = 0.92
#: SGLang 0.5.23 keeps this much host RAM free when sizing a host KV pool
#: (``srt/mem_cache/pool_host/base.py`` HICACHE_HOST_MEMORY_RESERVE_BYTES).
SGLANG_HOST_RESERVE_BYTES = 10 * 1024**3
#: Host pool / device pool when neither hicache_size nor hicache_ratio is set, and the share of the
#: per-rank budget that auto-sizing may use (``hicache_hook.py``, ``fields/memory.py``).
SGLANG_DEFAULT_HICACHE_RATIO = 2.0
SGLANG_HICACHE_HOST_FRACTION = 0.8

_GB = 1e9  # SGLang's --hicache-size is in GB of 10^9 bytes
_GIB = 1024**3
_MIB = 1024**2
#: The slowest poll interval wait_for_preflight accepts: 0.2 s, i.e. at least 5 Hz.
MAX_INTERVAL_S = 0.2

def sglang_runtime_mib(tp: int) -> float:
    """What SGLang 0.5.23 uses beyond ``mem_fraction_static`` (weights + KV) on each GPU, at least:
    512 MiB + 1.5 MiB x 2048 activation tokens + tp/8 GiB (``srt/arg_groups/memory_hook.py``;
    CUDA graphs and larger chunked prefills come on top of that)."""
    return 512 + 2048 * 1.5 + tp / 8 * 1024


def sglang_default_fraction(total_mib: int, tp: int) -> float:
    """SGLang's own ``mem_fraction_static`` default for a GPU of ``total_mib``: the runtime reserve
    left out, at least 10 GiB on GPUs over 60 GiB (``memory_hook.py``, CUDA graphs not counted)."""
    reserved = sglang_runtime_mib(tp)
    if total_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((total_mib - reserved) / total_mib, 3)


def claim_fraction(server: ServerConfig, settings: PreflightConfig, total_mib: int | None = None) -> tuple[float, str]:
    """(fraction of each GPU's total memory the engine claims, where that number comes from)."""
    if server.engine == "sglang":
        if server.mem_fraction_static is not None:
            return server.mem_fraction_static, "mem_fraction_static"
        if total_mib:
            return sglang_default_fraction(total_mib, server.tp), "SGLang's default mem_fraction_static for this GPU"
        return sglang_default_fraction(80 * 1024, server.tp), "SGLang's default mem_fraction_static (80 GiB GPU)"
    if server.engine == "vllm":
        if server.gpu_memory_utilization is not None:
            return server.gpu_memory_utilization, "gpu_memory_utilization"
        return VLLM_DEFAULT_FRACTION, "vLLM default gpu_memory_utilization"
    return settings.default_claim_fraction, "[preflight] default_claim_fraction"


def _num(x: float) -> str:
    """A size for people: no decimals when whole, else one."""
    return f"{x:.0f}" if abs(x - round(x)) < 0.05 else f"{x:.1f}"


# -- GPU rules ------------------------------------------------------------------------------------


def _memory_rule(gpu: GpuState, server: ServerConfig, settings: PreflightConfig) -> RuleResult:
    fraction, source = claim_fraction(server, settings, gpu.total_mib)
    claim = int(fraction * gpu.total_mib)
    margin = settings.memory_margin_mib
    # SGLang's fraction covers weights + KV only: activations come on top of it.
    runtime = int(sglang_runtime_mib(server.tp)) if server.engine == "sglang" else 0
    needed = claim + runtime + margin
    ok = gpu.free_mib >= needed
    on_top = f" + {runtime} MiB SGLang activations" if runtime else ""
    how = f"{fraction:g} x {gpu.total_mib} MiB ({source}){on_top} + {margin} MiB margin"
    if ok:
        detail = f"GPU {gpu.index} ({gpu.name}): free {gpu.free_mib} MiB >= {needed} MiB needed = {how}"
    else:
        detail = (f"GPU {gpu.index} ({gpu.name}): free {gpu.free_mib} MiB < {needed} MiB needed = {how}; "
                  f"short by {needed - gpu.free_mib} MiB (used {gpu.used_mib} MiB)")
    numbers: dict[str, Number] = {
        "total_mib": gpu.total_mib, "used_mib": gpu.used_mib, "free_mib": gpu.free_mib,
        "claim_fraction": fraction, "claim_mib": claim, "runtime_mib": runtime, "margin_mib": margin,
        "needed_mib": needed,
    }
    return RuleResult(GPU_MEMORY, ok, detail, gpu=gpu.index, numbers=numbers)


def describe_process(p: GpuProcess) -> str:
    """``pid 1234 python 40960 MiB``, saying so when the name or the MiB is unknown."""
    who = p.name if p.visible and p.name else (
        "(name not readable)" if p.visible else "(not visible in this pid namespace)")
    mib = f"{p.used_mib} MiB" if p.used_mib is not None else "MiB unknown (driver did not report)"
    return f"pid {p.pid} {who} {mib}"


def _process_rule(gpu: GpuState, ours: Collection[int]) -> RuleResult:
    mine = [p for p in gpu.processes if p.visible and p.pid in ours]
    foreign = [p for p in gpu.processes if p not in mine]
    known = sum(p.used_mib for p in foreign if p.used_mib is not None)
    numbers: dict[str, Number] = {
        "foreign_count": len(foreign), "foreign_mib": known,
        "foreign_unknown_mib_count": sum(1 for p in foreign if p.used_mib is None),
        "ours_count": len(mine),
    }
    if foreign:
        listed = "; ".join(describe_process(p) for p in foreign)
        detail = f"GPU {gpu.index}: {len(foreign)} foreign compute process(es): {listed}"
        return RuleResult(GPU_PROCESSES, False, detail, gpu=gpu.index, numbers=numbers)
    if mine:
        detail = f"GPU {gpu.index}: only harvest's own processes (pids {', '.join(str(p.pid) for p in mine)})"
    else:
        detail = f"GPU {gpu.index}: no compute processes"
    return RuleResult(GPU_PROCESSES, True, detail, gpu=gpu.index, numbers=numbers)


#: The GPU rules' words when [server] lists no GPUs (what is true, not a guess at the engine's kind).
NO_GPUS_LISTED = "no GPUs listed in [server] gpus"
#: ... and when the placement picks them (a Ray bundle asks for GPUs; Ray assigns them at placement).
GPUS_BY_RAY = "GPUs chosen by Ray at placement"


def _gpu_rules(server: ServerConfig, settings: PreflightConfig, probe: GpuProbe,
               ours: Collection[int], warnings: list[str], unlisted: str = NO_GPUS_LISTED) -> list[RuleResult]:
    if not server.gpus:
        text = unlisted
        return [RuleResult(GPU_MEMORY, True, text), RuleResult(GPU_PROCESSES, True, text)]
    try:
        snap = probe.snapshot()
    except ProbeError as exc:
        return [RuleResult(rule, False, f"GPU {i}: measurement failed: {exc}", gpu=i)
                for i in server.gpus for rule in (GPU_MEMORY, GPU_PROCESSES)]
    warnings.extend(snap.warnings)
    if snap.unavailable_reason is not None:
        return [RuleResult(rule, False, f"GPU {i} requested but {snap.unavailable_reason}; {cpu_hint(server.engine)}",
                           gpu=i) for i in server.gpus for rule in (GPU_MEMORY, GPU_PROCESSES)]
    by_index = {g.index: g for g in snap.gpus}
    results: list[RuleResult] = []
    for i in server.gpus:
        gpu = by_index.get(i)
        if gpu is None:
            have = ", ".join(str(k) for k in sorted(by_index)) or "none"
            text = f"GPU {i} requested but this machine has {len(by_index)} GPU(s) (indices: {have})"
            if not by_index:
                text += f"; {cpu_hint(server.engine)}"
            results += [RuleResult(GPU_MEMORY, False, text, gpu=i), RuleResult(GPU_PROCESSES, False, text, gpu=i)]
            continue
        results += [_memory_rule(gpu, server, settings), _process_rule(gpu, ours)]
    return results


# -- host rules -----------------------------------------------------------------------------------


def sglang_rank_budget_bytes(host: HostState, ranks: int) -> int:
    """Host RAM each SGLang rank may give its KV pool: ``(available - 10 GiB) // ranks_per_host``,
    available bounded by the memory cgroup (SGLang 0.5.23 ``host_memory_budget_bytes`` in
    ``srt/mem_cache/pool_host/base.py``)."""
    available = host.ram_available_mib * _MIB
    if host.cgroup_headroom_mib is not None:
        available = min(available, host.cgroup_headroom_mib * _MIB)
    return (available - SGLANG_HOST_RESERVE_BYTES) // max(1, ranks)


def _ram_rule(server: ServerConfig, settings: PreflightConfig, host: HostState,
              warnings: list[str] | None = None) -> RuleResult:
    avail_gb = host.ram_available_mib * _MIB / _GB
    numbers: dict[str, Number] = {"ram_available_mib": host.ram_available_mib, "ram_total_mib": host.ram_total_mib,
                                  "cgroup_headroom_mib": host.cgroup_headroom_mib}
    if server.engine == "vllm" and not server.gpus:
        return _vllm_cpu_ram_rule(server, settings, host, numbers)
    if not server.enable_hierarchical_cache:
        return RuleResult(HOST_RAM, True, f"hierarchical cache off: no host KV pool "
                          f"(available {_num(avail_gb)} GB)", numbers=numbers)
    if server.engine != "sglang":
        return RuleResult(HOST_RAM, True, f"skipped: enable_hierarchical_cache is an SGLang setting; not checked "
                          f"(available {_num(avail_gb)} GB)", numbers=numbers, skipped=True)
    ranks = server.tp
    budget = sglang_rank_budget_bytes(host, ranks)
    cgroup = " (cgroup-bounded)" if host.cgroup_headroom_mib is not None else ""
    share = (f"(available {_num(avail_gb)} GB{cgroup} - 10 GiB SGLang reserve) // {ranks} rank(s) = "
             f"{budget / _GB:.2f} GB per rank")
    numbers.update({"ranks": ranks, "reserve_bytes": SGLANG_HOST_RESERVE_BYTES, "budget_per_rank_bytes": budget,
                    "hicache_size_gb": server.hicache_size, "hicache_ratio": server.hicache_ratio})
    if server.hicache_size is not None:
        wanted = int(server.hicache_size * _GB)
        numbers.update({"pool_per_rank_bytes": wanted, "pool_gb": server.hicache_size * ranks})
        ok = wanted <= budget
        rel = "<=" if ok else ">"
        detail = f"hicache_size {server.hicache_size} GB per rank {rel} {share}"
        if not ok:
            detail += " (SGLang would exit: \"Not enough host memory available\")"
        return RuleResult(HOST_RAM, ok, detail, numbers=numbers)
    if budget <= 0:
        return RuleResult(HOST_RAM, False, f"no host RAM for SGLang's host KV pool: {share}", numbers=numbers)
    if server.hicache_ratio is None:
        cap = int(SGLANG_HICACHE_HOST_FRACTION * budget)
        numbers["pool_per_rank_bytes"] = cap
        return RuleResult(HOST_RAM, True, f"hicache_size unset: SGLang sizes the pool itself, "
                          f"{SGLANG_DEFAULT_HICACHE_RATIO:g} x the device KV pool, at most "
                          f"{SGLANG_HICACHE_HOST_FRACTION:g} x {share} = {cap / _GB:.2f} GB per rank",
                          numbers=numbers)
    # An explicit ratio is not fitted to the host: ratio x the device KV pool, which is at most
    # the fraction SGLang claims on a GPU (weights are in it too) - known only after the launch.
    numbers["pool_per_rank_bytes"] = None
    detail = (f"hicache_ratio {server.hicache_ratio:g} x the device KV pool (known after the launch) "
              f"must fit {share}")
    if warnings is not None:
        warnings.append(f"host-ram: {detail}; SGLang exits with \"Not enough host memory available\" if not")
    return RuleResult(HOST_RAM, True, detail, numbers=numbers)


def _vllm_cpu_ram_rule(server: ServerConfig, settings: PreflightConfig, host: HostState,
                       numbers: dict[str, Number]) -> RuleResult:
    """vLLM's CPU build keeps its KV cache in host RAM: ``VLLM_CPU_KVCACHE_SPACE`` GiB when set,
    else it reserves ``gpu_memory_utilization`` x the RAM and refuses to start when that much is not
    available (0.32.0 ``vllm/v1/worker/cpu_worker.py``, per NUMA node; here the whole host)."""
    available_mib = host.ram_available_mib
    if host.cgroup_headroom_mib is not None:
        available_mib = min(available_mib, host.cgroup_headroom_mib)
    space = server.env.get("VLLM_CPU_KVCACHE_SPACE", "").strip()
    if space.isdigit() and int(space) > 0:
        needed = int((int(space) + settings.ram_reserve_gib) * 1024)
        how = f"VLLM_CPU_KVCACHE_SPACE {space} GiB KV cache + {settings.ram_reserve_gib:g} GiB reserve"
    else:
        fraction = server.gpu_memory_utilization or VLLM_DEFAULT_FRACTION
        needed = int(fraction * host.ram_total_mib)
        how = f"{fraction:g} x {host.ram_total_mib} MiB RAM (gpu_memory_utilization on the CPU build)"
    ok = available_mib >= needed
    numbers.update({"needed_mib": needed})
    rel = ">=" if ok else "<"
    return RuleResult(HOST_RAM, ok, f"vLLM CPU: available {available_mib} MiB {rel} {needed} MiB needed = {how}",
                      numbers=numbers)


def _swap_rule(settings: PreflightConfig, host: HostState) -> RuleResult:
    ok = host.swap_used_mib <= settings.max_swap_used_mib
    rel = "<=" if ok else ">"
    detail = (f"swap used {host.swap_used_mib} MiB {rel} {settings.max_swap_used_mib} MiB allowed "
              f"(swap total {host.swap_total_mib} MiB)")
    numbers: dict[str, Number] = {"swap_used_mib": host.swap_used_mib, "swap_total_mib": host.swap_total_mib,
                                  "max_swap_used_mib": settings.max_swap_used_mib}
    return RuleResult(SWAP, ok, detail, numbers=numbers)


def _port_rule(server: ServerConfig) -> RuleResult:
    host, port = server.host, server.port
    numbers: dict[str, Number] = {"port": port, "host": host}
    if port_bindable(host, port):
        return RuleResult(PORT, True, f"port {port} is free on {host}", numbers=numbers)
    holders = []
    for pid in listening_pids(port):
        try:
            holders.append(f"pid {pid} {psutil.Process(pid).name()}")
        except psutil.Error:
            holders.append(f"pid {pid}")
    if holders:
        how = f"; listening: {', '.join(holders)}"
    elif port_listening(host, port):
        how = "; something is listening there (its process is not visible to this user)"
    else:
        how = "; bound by a socket that is not listening, or the address is not available here"
    return RuleResult(PORT, False, f"port {port} on {host} is in use{how}", numbers=numbers)


def _disk_rule(settings: PreflightConfig, output_dir: Path, disk: DiskState) -> RuleResult:
    free_gib = disk.free_mib / 1024
    ok = free_gib >= settings.min_disk_free_gib
    rel = ">=" if ok else "<"
    detail = (f"{output_dir}: free {free_gib:.1f} GiB {rel} {settings.min_disk_free_gib:g} GiB required "
              f"(file system of {disk.path})")
    numbers: dict[str, Number] = {"free_mib": disk.free_mib, "total_mib": disk.total_mib,
                                  "min_disk_free_gib": settings.min_disk_free_gib}
    return RuleResult(DISK, ok, detail, numbers=numbers)


# -- entry points ---------------------------------------------------------------------------------


def run_preflight(server: ServerConfig, settings: PreflightConfig, *, probe: GpuProbe, output_dir: Path,
                  host: HostState | None = None, disk: DiskState | None = None,
                  ours: Collection[int] = (), unlisted_gpus: str = NO_GPUS_LISTED,
                  paths: Sequence[NamedPath] = ()) -> PreflightReport:
    """Measure once and judge every rule. ``host``/``disk`` default to measuring now; ``ours`` are
    pids harvest itself started (not counted as foreign); ``unlisted_gpus`` is what the GPU rules
    say when [server] lists no GPUs (the placement knows why); ``paths``: what the job names that
    must be there (``harvest.server.engine_paths``, and the data where harvest reads it)."""
    results: list[RuleResult] = []
    warnings: list[str] = []
    if not server.launched:
        skip = f"skipped: engine '{server.engine}' is a running endpoint harvest does not launch"
        results += [RuleResult(rule, True, skip, skipped=True) for rule in (GPU_MEMORY, GPU_PROCESSES,
                                                                            HOST_RAM, SWAP, PORT)]
    else:
        results += _gpu_rules(server, settings, probe, ours, warnings, unlisted_gpus)
        try:
            measured = host if host is not None else host_state()
        except ProbeError as exc:
            results += [RuleResult(rule, False, f"measurement failed: {exc}") for rule in (HOST_RAM, SWAP)]
        else:
            results += [_ram_rule(server, settings, measured, warnings), _swap_rule(settings, measured)]
        results.append(_port_rule(server))
    results.append(paths_rule(paths, {**os.environ, **server.env}))
    try:
        results.append(_disk_rule(settings, Path(output_dir),
                                  disk if disk is not None else disk_state(output_dir)))
    except ProbeError as exc:
        results.append(RuleResult(DISK, False, f"measurement failed: {exc}"))
    return PreflightReport(results=tuple(results), warnings=tuple(dict.fromkeys(warnings)))


def wait_for_preflight(server: ServerConfig, settings: PreflightConfig, *, probe: GpuProbe,
                       output_dir: Path, wait_s: float, interval_s: float = MAX_INTERVAL_S,
                       host: HostState | None = None, disk: DiskState | None = None,
                       ours: Collection[int] = (), clock: Callable[[], float] = time.monotonic,
                       sleep: Callable[[float], None] = time.sleep,
                       paths: Sequence[NamedPath] = ()) -> PreflightReport:
    """Run the preflight every ``interval_s`` (<= 0.2 s: at least 5 Hz) until it passes or
    ``wait_s`` seconds pass; one last measurement is taken at the deadline. Returns the last report.
    ``clock`` and ``sleep`` are time seams for tests."""
    if not 0 < interval_s <= MAX_INTERVAL_S:
        raise ValueError(f"interval_s must be in (0, {MAX_INTERVAL_S}] to poll at >= 5 Hz, got {interval_s}")
    start = clock()
    deadline = start + max(0.0, wait_s)
    attempts = 0
    while True:
        report = run_preflight(server, settings, probe=probe, output_dir=output_dir, host=host, disk=disk,
                               ours=ours, paths=paths)
        attempts += 1
        now = clock()
        if report.passed or now >= deadline:
            return replace(report, attempts=attempts, waited_s=round(now - start, 3))
        # Ticks on a fixed schedule, so a slow measurement does not stretch the interval.
        next_tick = start + attempts * interval_s
        sleep(max(0.0, min(next_tick, deadline) - clock()))


__all__ = [
    "DISK", "GPUS_BY_RAY", "GPU_MEMORY", "GPU_PROCESSES", "HOST_RAM", "NO_GPUS_LISTED", "PATHS", "PORT", "RULES", "SWAP",
    "Number", "PreflightReport", "RuleResult", "claim_fraction", "describe_process", "run_preflight",
    "sglang_default_fraction", "sglang_rank_budget_bytes", "sglang_runtime_mib", "wait_for_preflight",
]
