"""Preflight: is it safe to launch this server config on this machine now, and if not, why not.

One :class:`RuleResult` per rule (per chosen GPU for the GPU rules), each with the measured numbers
in its detail text and in ``numbers``:

    gpu-memory      free MiB >= what the engine will claim (fraction x total) + margin
    gpu-processes   no compute processes on the chosen GPUs other than harvest's own (``ours``)
    host-ram        RAM available >= hicache_size GB x tp + reserve (SGLang's host KV pool, per rank)
    swap            swap used <= max_swap_used_mib
    port            the server's port can be bound on its bind address
    disk            the output folder's file system has min_disk_free_gib free

Everything is measured at call time through the probe, psutil and a bind check. This module never
starts, signals or waits for a process beyond its own polling deadline, and never turns a failed
measurement into a pass: a probe error is a failed rule that carries the error.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Union

import psutil

from harvest.config import PreflightConfig, ServerConfig
from harvest.errors import ProbeError
from harvest.gpu.host import disk_state, host_state
from harvest.gpu.records import DiskState, GpuProbe, GpuProcess, GpuState, HostState
from harvest.hosts.net import listening_pids, port_bindable, port_listening

GPU_MEMORY = "gpu-memory"
GPU_PROCESSES = "gpu-processes"
HOST_RAM = "host-ram"
SWAP = "swap"
PORT = "port"
DISK = "disk"
RULES = (GPU_MEMORY, GPU_PROCESSES, HOST_RAM, SWAP, PORT, DISK)

#: What SGLang / vLLM claim when the config leaves their fraction unset.
SGLANG_DEFAULT_FRACTION = 0.88
VLLM_DEFAULT_FRACTION = 0.9

_GB = 1e9  # SGLang's --hicache-size is in GB of 10^9 bytes
_GIB = 1024**3
_MIB = 1024**2
#: The slowest poll interval wait_for_preflight accepts: 0.2 s, i.e. at least 5 Hz.
MAX_INTERVAL_S = 0.2

Number = Union[int, float, str, None]


@dataclass(frozen=True)
class RuleResult:
    """The verdict of one rule (for one GPU when ``gpu`` is set), with the numbers it compared."""

    rule: str
    passed: bool
    detail: str
    gpu: int | None = None
    numbers: dict[str, Number] = field(default_factory=dict)
    #: True when the rule does not apply to this config (it then counts as passed).
    skipped: bool = False


@dataclass(frozen=True)
class PreflightReport:
    """Every rule's result. ``attempts``/``waited_s`` say how long wait_for_preflight polled."""

    results: tuple[RuleResult, ...]
    #: Probe warnings (e.g. "v1 memory query: used includes driver-reserved memory").
    warnings: tuple[str, ...] = ()
    attempts: int = 1
    waited_s: float = 0.0

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failures(self) -> tuple[RuleResult, ...]:
        return tuple(r for r in self.results if not r.passed)


def claim_fraction(server: ServerConfig, settings: PreflightConfig) -> tuple[float, str]:
    """(fraction of each GPU's total memory the engine claims, where that number comes from)."""
    if server.engine == "sglang":
        if server.mem_fraction_static is not None:
            return server.mem_fraction_static, "mem_fraction_static"
        return SGLANG_DEFAULT_FRACTION, "SGLang default mem_fraction_static"
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
    fraction, source = claim_fraction(server, settings)
    claim = int(fraction * gpu.total_mib)
    margin = settings.memory_margin_mib
    needed = claim + margin
    ok = gpu.free_mib >= needed
    how = f"{fraction:g} x {gpu.total_mib} MiB ({source}) + {margin} MiB margin"
    if ok:
        detail = f"GPU {gpu.index} ({gpu.name}): free {gpu.free_mib} MiB >= {needed} MiB needed = {how}"
    else:
        detail = (f"GPU {gpu.index} ({gpu.name}): free {gpu.free_mib} MiB < {needed} MiB needed = {how}; "
                  f"short by {needed - gpu.free_mib} MiB (used {gpu.used_mib} MiB)")
    numbers: dict[str, Number] = {
        "total_mib": gpu.total_mib, "used_mib": gpu.used_mib, "free_mib": gpu.free_mib,
        "claim_fraction": fraction, "claim_mib": claim, "margin_mib": margin, "needed_mib": needed,
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


def _gpu_rules(server: ServerConfig, settings: PreflightConfig, probe: GpuProbe,
               ours: Collection[int], warnings: list[str]) -> list[RuleResult]:
    if not server.gpus:
        text = "no GPUs requested (CPU engine)"
        return [RuleResult(GPU_MEMORY, True, text), RuleResult(GPU_PROCESSES, True, text)]
    try:
        snap = probe.snapshot()
    except ProbeError as exc:
        return [RuleResult(rule, False, f"GPU {i}: measurement failed: {exc}", gpu=i)
                for i in server.gpus for rule in (GPU_MEMORY, GPU_PROCESSES)]
    warnings.extend(snap.warnings)
    if snap.unavailable_reason is not None:
        return [RuleResult(rule, False, f"GPU {i} requested but {snap.unavailable_reason}", gpu=i)
                for i in server.gpus for rule in (GPU_MEMORY, GPU_PROCESSES)]
    by_index = {g.index: g for g in snap.gpus}
    results: list[RuleResult] = []
    for i in server.gpus:
        gpu = by_index.get(i)
        if gpu is None:
            have = ", ".join(str(k) for k in sorted(by_index)) or "none"
            text = f"GPU {i} requested but this machine has {len(by_index)} GPU(s) (indices: {have})"
            results += [RuleResult(GPU_MEMORY, False, text, gpu=i), RuleResult(GPU_PROCESSES, False, text, gpu=i)]
            continue
        results += [_memory_rule(gpu, server, settings), _process_rule(gpu, ours)]
    return results


# -- host rules -----------------------------------------------------------------------------------


def _ram_rule(server: ServerConfig, settings: PreflightConfig, host: HostState) -> RuleResult:
    avail_gb = host.ram_available_mib * _MIB / _GB
    numbers: dict[str, Number] = {"ram_available_mib": host.ram_available_mib, "ram_total_mib": host.ram_total_mib}
    if not server.enable_hierarchical_cache:
        return RuleResult(HOST_RAM, True, f"hierarchical cache off: no host KV pool "
                          f"(available {_num(avail_gb)} GB)", numbers=numbers)
    if server.engine != "sglang" or server.hicache_size is None:
        why = ("enable_hierarchical_cache is an SGLang setting" if server.engine != "sglang"
               else "hicache_size unset: SGLang sizes the host pool itself")
        return RuleResult(HOST_RAM, True, f"skipped: {why}; not checked (available {_num(avail_gb)} GB)",
                          numbers=numbers, skipped=True)
    pool_gb = server.hicache_size * server.tp
    needed_mib = int((pool_gb * _GB + settings.ram_reserve_gib * _GIB) / _MIB)
    ok = host.ram_available_mib >= needed_mib
    # hicache_size is SGLang's unit (GB = 10^9 bytes); the reserve is configured in GiB.
    detail = (f"needs {_num(pool_gb)} GB + {settings.ram_reserve_gib:g} GiB reserve, "
              f"available {_num(avail_gb)} GB (hicache_size {server.hicache_size:g} GB per rank x tp {server.tp})")
    numbers.update({"hicache_gb_per_rank": server.hicache_size, "tp": server.tp, "pool_gb": pool_gb,
                    "reserve_gib": settings.ram_reserve_gib, "needed_mib": needed_mib})
    return RuleResult(HOST_RAM, ok, detail, numbers=numbers)


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
                  ours: Collection[int] = ()) -> PreflightReport:
    """Measure once and judge every rule. ``host``/``disk`` default to measuring now; ``ours`` are
    pids harvest itself started (not counted as foreign)."""
    results: list[RuleResult] = []
    warnings: list[str] = []
    if not server.launched:
        skip = f"skipped: engine '{server.engine}' is a running endpoint harvest does not launch"
        results += [RuleResult(rule, True, skip, skipped=True) for rule in (GPU_MEMORY, GPU_PROCESSES,
                                                                            HOST_RAM, SWAP, PORT)]
    else:
        results += _gpu_rules(server, settings, probe, ours, warnings)
        try:
            measured = host if host is not None else host_state()
        except ProbeError as exc:
            results += [RuleResult(rule, False, f"measurement failed: {exc}") for rule in (HOST_RAM, SWAP)]
        else:
            results += [_ram_rule(server, settings, measured), _swap_rule(settings, measured)]
        results.append(_port_rule(server))
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
                       sleep: Callable[[float], None] = time.sleep) -> PreflightReport:
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
                               ours=ours)
        attempts += 1
        now = clock()
        if report.passed or now >= deadline:
            return replace(report, attempts=attempts, waited_s=round(now - start, 3))
        # Ticks on a fixed schedule, so a slow measurement does not stretch the interval.
        next_tick = start + attempts * interval_s
        sleep(max(0.0, min(next_tick, deadline) - clock()))


__all__ = [
    "DISK", "GPU_MEMORY", "GPU_PROCESSES", "HOST_RAM", "PORT", "RULES", "SWAP",
    "PreflightReport", "RuleResult", "claim_fraction", "describe_process", "run_preflight",
    "wait_for_preflight",
]
