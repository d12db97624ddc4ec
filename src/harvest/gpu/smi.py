"""The nvidia-smi fallback probe, for machines where the NVML library cannot be loaded from Python.

It runs two CSV queries and parses them:

    nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used,memory.free,utilization.gpu
               --format=csv,noheader,nounits
    nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader,nounits

Every subprocess call has a timeout; the command runner is a seam (``runner``) so tests feed
captured text. ``[N/A]`` is None for optional values (utilization, a process's MiB) and an error
for the memory numbers verification depends on. This module never signals a process and never
takes a process name for a pid this host cannot see.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence

from harvest.errors import NoDriverError, ProbeError
from harvest.gpu.host import in_host_pid_namespace, resolve_gpu_pid
from harvest.gpu.records import GpuProcess, GpuSnapshot, GpuState, ProbeSource

#: Runs an argv with a timeout in seconds and returns its stdout; raises ProbeError / NoDriverError.
Runner = Callable[[Sequence[str], float], str]

GPU_FIELDS = ("index", "uuid", "name", "memory.total", "memory.used", "memory.free", "utilization.gpu")
APP_FIELDS = ("gpu_uuid", "pid", "process_name", "used_memory")
_CSV = "--format=csv,noheader,nounits"

#: nvidia-smi exit codes meaning "no driver here": 9 driver not loaded, 12 NVML library not found.
_NO_DRIVER_CODES = (9, 12)


def run_command(argv: Sequence[str], timeout: float) -> str:
    """Run nvidia-smi (or any argv) with a timeout; stdout on success, typed errors otherwise."""
    call = " ".join(argv)
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        raise NoDriverError(f"no NVIDIA driver found ({argv[0]} not installed)", call=call) from exc
    except subprocess.TimeoutExpired as exc:
        raise ProbeError(f"timed out after {timeout:g} s", call=call) from exc
    except OSError as exc:
        raise ProbeError(f"cannot run: {exc}", call=call) from exc
    if done.returncode in _NO_DRIVER_CODES:
        raise NoDriverError(f"no NVIDIA driver found (exit code {done.returncode})", call=call)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-500:]
        raise ProbeError(f"exit code {done.returncode}: {tail}", call=call)
    return done.stdout


def _na(value: str) -> bool:
    return value.strip() in ("[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", "")


def _rows(text: str) -> list[list[str]]:
    """Rows of nvidia-smi CSV; informational lines ("No devices were found") yield none.

    nvidia-smi separates cells with ", " and never quotes, so a name keeps a bare comma intact.
    """
    rows = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("No "):
            continue
        rows.append([cell.strip() for cell in line.split(", ")])
    return rows


def _int(value: str, *, what: str, gpu: int | None, call: str) -> int:
    try:
        return int(float(value))
    except ValueError:
        raise ProbeError(f"nvidia-smi reported {what} as {value!r}", gpu=gpu, call=call) from None


def parse_gpus(text: str) -> list[tuple[int, str, str, int, int, int, int | None]]:
    """Rows of the GPU query: (index, uuid, name, total, used, free MiB, utilization % or None)."""
    call = "nvidia-smi --query-gpu"
    out = []
    for row in _rows(text):
        if len(row) < len(GPU_FIELDS):
            raise ProbeError(f"unexpected nvidia-smi line: {', '.join(row)!r}", call=call)
        # A GPU name may contain a comma: index and uuid lead, the five numbers close the row.
        index = _int(row[0], what="index", gpu=None, call=call)
        uuid, name = row[1], ", ".join(row[2:-4])
        total, used, free = (_int(v, what=f, gpu=index, call=call)
                             for v, f in zip(row[-4:-1], GPU_FIELDS[3:6]))
        util = None if _na(row[-1]) else _int(row[-1], what="utilization.gpu", gpu=index, call=call)
        out.append((index, uuid, name, total, used, free, util))
    return out


def parse_apps(text: str) -> list[tuple[str, int, str, int | None]]:
    """Rows of the compute-apps query: (gpu uuid, pid, process name, MiB or None for [N/A])."""
    call = "nvidia-smi --query-compute-apps"
    out = []
    for row in _rows(text):
        if len(row) < len(APP_FIELDS):
            raise ProbeError(f"unexpected nvidia-smi line: {', '.join(row)!r}", call=call)
        pid = _int(row[1], what="pid", gpu=None, call=call)
        mib = None if _na(row[-1]) else _int(row[-1], what="used_memory", gpu=None, call=call)
        out.append((row[0], pid, ", ".join(row[2:-1]), mib))
    return out


class SmiProbe:
    """Measures GPUs by parsing nvidia-smi. Lifecycle: construct (checks nvidia-smi runs) -> snapshot()*.

    ``runner`` runs an argv with a timeout and returns stdout (default: a subprocess).
    Raises :class:`NoDriverError` when nvidia-smi is missing or says there is no driver.
    """

    source: ProbeSource = "nvidia-smi"

    def __init__(self, runner: Runner | None = None, *, executable: str = "nvidia-smi",
                 timeout_s: float = 10.0, host_pid_namespace: bool | None = None):
        self._run = runner or run_command
        self._exe = executable
        self._timeout = timeout_s
        self._host_ns = in_host_pid_namespace() if host_pid_namespace is None else host_pid_namespace
        self._closed = False
        # Proves nvidia-smi runs and sees the driver; the version is shown with every snapshot.
        rows = _rows(self._query(["--query-gpu=driver_version"]))
        self._driver = rows[0][0] if rows and rows[0] and not _na(rows[0][0]) else None

    def _query(self, args: list[str]) -> str:
        if self._closed:
            raise ProbeError("the nvidia-smi probe is closed", call=self._exe)
        return self._run([self._exe, *args, _CSV], self._timeout)

    def memory_used(self, indices: list[int]) -> dict[int, int]:
        """Used MiB per GPU index (one nvidia-smi call: ~0.1 s, slower than NVML)."""
        if not indices:
            return {}
        call = "nvidia-smi --query-gpu=index,memory.used"
        seen: dict[int, int] = {}
        for row in _rows(self._query(["--query-gpu=index,memory.used"])):
            index = _int(row[0], what="index", gpu=None, call=call)
            seen[index] = _int(row[-1], what="memory.used", gpu=index, call=call)
        missing = [i for i in indices if i not in seen]
        if missing:
            raise ProbeError(f"no GPU with index {missing[0]}: nvidia-smi lists {sorted(seen)}",
                             gpu=missing[0], call=call)
        return {i: seen[i] for i in indices}

    def snapshot(self) -> GpuSnapshot:
        """Every GPU with memory, utilization and compute processes. Raises ProbeError on failure."""
        gpus = parse_gpus(self._query(["--query-gpu=" + ",".join(GPU_FIELDS)]))
        apps = parse_apps(self._query(["--query-compute-apps=" + ",".join(APP_FIELDS)]))
        warnings = ["measured with nvidia-smi (NVML library not loadable from Python): "
                    "used memory may include driver-reserved memory"]
        by_uuid: dict[str, list[GpuProcess]] = {uuid: [] for _, uuid, *_ in gpus}
        for uuid, pid, _smi_name, mib in apps:
            visible, name = resolve_gpu_pid(pid, host_namespace=self._host_ns)
            if uuid not in by_uuid:
                warnings.append(f"nvidia-smi lists pid {pid} on unknown GPU {uuid}")
                continue
            by_uuid[uuid].append(GpuProcess(pid=pid, name=name, used_mib=mib, visible=visible))
        states = tuple(
            GpuState(index=index, uuid=uuid, name=name, total_mib=total, used_mib=used, free_mib=free,
                     reserved_mib=None, utilization_pct=util, processes=tuple(by_uuid[uuid]))
            for index, uuid, name, total, used, free, util in gpus
        )
        if self._host_ns is not True and any(not p.visible for g in states for p in g.processes):
            warnings.append("some GPU processes are not visible in this pid namespace (container?): "
                            "their pids belong to another namespace")
        return GpuSnapshot(source="nvidia-smi", gpus=states, driver_version=self._driver,
                           warnings=tuple(warnings))

    def close(self) -> None:
        """Nothing to release; later queries raise. Idempotent."""
        self._closed = True


__all__ = ["APP_FIELDS", "GPU_FIELDS", "Runner", "SmiProbe", "parse_apps", "parse_gpus", "run_command"]
