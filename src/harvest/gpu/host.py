"""Host-side measurements: RAM and swap, free disk, and which GPU-holding pids this host can see.

Everything here is measured through psutil or /proc at call time. This module never signals a
process, never creates a folder and never guesses a process by its name: a pid the driver reports
that cannot be matched to a process in this pid namespace is reported as not visible.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil

from harvest.errors import ProbeError
from harvest.gpu.records import DiskState, HostState

_MIB = 1024 * 1024

#: Inode number of the initial (host) pid namespace: the kernel constant PROC_PID_INIT_INO.
_INIT_PID_NS_INO = 0xEFFFFFFC


def host_state() -> HostState:
    """RAM total/available and swap total/used of this host, in MiB."""
    try:
        vm = psutil.virtual_memory()
        sw = psutil.swap_memory()
    except (OSError, RuntimeError) as exc:  # psutil raises these when /proc cannot be read
        raise ProbeError(f"cannot read host memory: {exc}", call="psutil.virtual_memory") from exc
    headroom = cgroup_memory_headroom()
    return HostState(
        ram_total_mib=vm.total // _MIB,
        ram_available_mib=vm.available // _MIB,
        swap_total_mib=sw.total // _MIB,
        swap_used_mib=sw.used // _MIB,
        cgroup_headroom_mib=headroom // _MIB if headroom is not None else None,
    )


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (no limit) -> None


def _page_cache(directory: Path, keys: tuple[str, ...]) -> int:
    try:
        stat = dict(line.split() for line in (directory / "memory.stat").read_text().splitlines())
    except (OSError, ValueError):
        return 0
    return sum(int(stat.get(k, 0)) for k in keys)


def cgroup_memory_headroom(proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes this process's memory cgroup (and its parents) still allow, counting page cache as
    reclaimable, as SGLang 0.5.23 bounds its host KV pool (``srt/mem_cache/host_memory.py``).
    cgroup v2 ``memory.max``/``memory.high`` or v1 ``memory.limit_in_bytes``; None without a limit."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    headroom: int | None = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if not controllers:  # cgroup v2
            limits: tuple[str, ...]
            base, limits, usage_name = cgroup_root, ("memory.max", "memory.high"), "memory.current"
            cache_keys: tuple[str, ...] = ("active_file", "inactive_file")
        elif "memory" in controllers.split(","):
            base, limits, usage_name = cgroup_root / "memory", ("memory.limit_in_bytes",), "memory.usage_in_bytes"
            cache_keys = ("total_active_file", "total_inactive_file")
        else:
            continue
        directory = base / path.lstrip("/")
        while True:
            for name in limits:
                limit = _read_int(directory / name)
                usage = _read_int(directory / usage_name)
                if limit is None or usage is None or limit >= 1 << 60:  # v1 "unlimited" is ~2^63
                    continue
                remaining = max(0, limit - max(0, usage - _page_cache(directory, cache_keys)))
                headroom = remaining if headroom is None else min(headroom, remaining)
            if directory == base or base not in directory.parents:
                break
            directory = directory.parent
    return headroom


def nearest_existing(path: str | Path) -> Path:
    """``path`` itself if it exists, else its nearest existing parent (the folder it would go in)."""
    p = Path(path).expanduser().absolute()
    for candidate in (p, *p.parents):
        if candidate.exists():
            return candidate
    return Path(p.anchor or os.sep)


def disk_state(path: str | Path) -> DiskState:
    """Free space of the file system that holds ``path`` (or would hold it, if it does not exist yet)."""
    where = nearest_existing(path)
    try:
        usage = psutil.disk_usage(str(where))
    except OSError as exc:
        raise ProbeError(f"cannot read free disk space of {where}: {exc}", call="psutil.disk_usage") from exc
    return DiskState(path=str(where), total_mib=usage.total // _MIB, free_mib=usage.free // _MIB)


def in_host_pid_namespace() -> bool | None:
    """True when this process lives in the host's pid namespace, False in a nested one (a container).

    None when it cannot be told (no /proc, not Linux). GPU drivers report pids of the host namespace;
    inside a container those numbers may name unrelated processes here.
    """
    try:
        return os.stat("/proc/self/ns/pid").st_ino == _INIT_PID_NS_INO
    except OSError:
        return None


def _holds_nvidia_device(proc: psutil.Process) -> bool | None:
    """Whether the process has a /dev/nvidia* device open; None when its fds cannot be read."""
    fd_dir = f"/proc/{proc.pid}/fd"
    try:
        entries = os.listdir(fd_dir)
    except OSError:
        return None
    for entry in entries:
        try:
            if os.readlink(f"{fd_dir}/{entry}").startswith("/dev/nvidia"):
                return True
        except OSError:
            continue
    return False


def resolve_gpu_pid(pid: int, *, host_namespace: bool | None) -> tuple[bool, str | None]:
    """Match a pid reported by the GPU driver to a process visible here: ``(visible, name)``.

    In the host pid namespace a pid that exists here is that process. In a nested (or unknown)
    namespace a process with the same number is only accepted when it has an NVIDIA device open;
    otherwise the pid belongs to another namespace and is reported as not visible, without a name.
    """
    try:
        proc = psutil.Process(pid)
    except (psutil.NoSuchProcess, psutil.ZombieProcess, ValueError):
        return False, None
    except psutil.AccessDenied:
        return (True, None) if host_namespace else (False, None)
    if not host_namespace and _holds_nvidia_device(proc) is not True:
        return False, None
    try:
        name: str | None = proc.name()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False, None
    except psutil.AccessDenied:
        name = None
    return True, name


__all__ = ["cgroup_memory_headroom", "disk_state", "host_state", "in_host_pid_namespace", "nearest_existing", "resolve_gpu_pid"]
