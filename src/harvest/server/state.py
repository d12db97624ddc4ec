"""The launch record of a server harvest started, kept in a state file any process can read.

A run folder (mode 0700) holds ``launch.json`` (mode 0600, replaced atomically): the
:class:`LaunchRecord` written once right after the engine was spawned, the descendants seen since
(pid + create time), the recorded status and, after a stop, the stop report. ``server.log`` holds
the engine's stdout and stderr. ``harvest stop`` from another shell, or after the launching process
was killed, works from this file alone.

A user-wide index (``$HARVEST_STATE_DIR``, else ``$XDG_STATE_HOME/harvest``, else
``~/.local/state/harvest``) lists the run folders harvest launched, for ``harvest ps``.

This module stores *recorded* state only. It never measures processes, GPUs or ports, and it never
signals anything; :mod:`harvest.server.procs` and :mod:`harvest.server.stop` do that.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import json
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from harvest import safefiles
from harvest.errors import StopError, UnsafePathError
from harvest.redact import redact_argv
from harvest.stops import ProcessRef

STATE_FILE = "launch.json"
LOG_FILE = "server.log"
STOP_FILE = "stop.json"
#: The log of a detached server's watcher (``harvest serve --detach``).
WATCH_LOG = "watch.log"
#: The lock every update of ``launch.json`` is made under.
LOCK_FILE = f".{STATE_FILE}.lock"
#: Every file a launch writes in its run folder, by name: checked before the engine is spawned.
RUN_FILES = (STATE_FILE, LOCK_FILE, LOG_FILE, STOP_FILE, WATCH_LOG)
SCHEMA = 1


class RunStatus(str, enum.Enum):
    """What harvest last *recorded* about a run (measured liveness is a separate query)."""

    #: Spawned; readiness not yet confirmed.
    STARTING = "starting"
    #: Readiness checks passed.
    READY = "ready"
    #: Start-up failed (exit, fatal log line, timeout); cleanup followed.
    FAILED = "failed"
    #: A stop is under way.
    STOPPING = "stopping"
    #: A stop finished with a clean verdict.
    STOPPED = "stopped"
    #: A stop finished but measured something left behind (see stop.json).
    DIRTY = "dirty"


@dataclass(frozen=True)
class LaunchRecord:
    """What was launched, written once right after the spawn."""

    engine: str
    pid: int
    pgid: int
    create_time: float
    #: argv with secrets replaced by ``***``.
    argv: tuple[str, ...]
    host: str
    port: int
    url: str
    gpus: tuple[int, ...]
    #: Used MiB of each GPU the server may use, measured just before the spawn.
    baseline_mib: dict[int, int]
    engine_version: str | None
    started_at: float
    log_path: str
    stop_grace: float
    stop_deadline: float
    #: The process that launched the server (it may be gone since; informative only).
    launcher_pid: int = 0
    #: This launch's number in its run folder (1, 2, ...; 0 in records written before numbering):
    #: earlier launches' files are kept under ``launches/N/`` (:mod:`harvest.server.history`).
    launch: int = 0

    @property
    def leader(self) -> ProcessRef:
        return ProcessRef(self.pid, self.create_time, None)


@dataclass(frozen=True)
class RunState:
    """The whole content of a state file."""

    record: LaunchRecord
    status: RunStatus
    descendants: tuple[ProcessRef, ...] = ()
    updated_at: float = 0.0
    #: A background watcher recording descendants for a detached server, if any.
    watcher: ProcessRef | None = None
    kv_capacity_tokens: int | None = None
    note: str | None = None

    def processes(self) -> tuple[ProcessRef, ...]:
        """The leader and every recorded descendant: the only pids a stop may signal."""
        return (self.record.leader, *self.descendants)


def make_run_dir(path: Path | str) -> safefiles.Folder:
    """The run folder, held: created 0700 when absent; an existing one must be this user's own and
    not writable by group or others, in parents nobody else can rename it out of (never chmod-ed;
    see :mod:`harvest.safefiles`)."""
    return safefiles.hold(path, create=True)


def check_run_files(folder: safefiles.Folder, also: Iterable[str] = ()) -> None:
    """Refuse (:class:`UnsafePathError`) the first file a launch would write in ``folder`` that
    harvest refuses to write: a symlink, another user's file, one with other hard links, not a
    regular file (:data:`RUN_FILES` and ``also``, e.g. an adapter's private files). Called before
    the engine is spawned, so that a refusal never leaves an engine running without its record."""
    for name in (*RUN_FILES, *also):
        folder.check_file(name)


def _ref_from(d: dict[str, Any]) -> ProcessRef:
    return ProcessRef(int(d["pid"]), float(d["create_time"]), d.get("name"))


def state_to_dict(state: RunState) -> dict[str, Any]:
    rec = asdict(state.record)
    rec["argv"] = list(state.record.argv)
    rec["gpus"] = list(state.record.gpus)
    rec["baseline_mib"] = {str(k): v for k, v in state.record.baseline_mib.items()}
    return {
        "schema": SCHEMA,
        "record": rec,
        "status": state.status.value,
        "descendants": [asdict(d) for d in state.descendants],
        "updated_at": state.updated_at,
        "watcher": asdict(state.watcher) if state.watcher else None,
        "kv_capacity_tokens": state.kv_capacity_tokens,
        "note": state.note,
    }


def state_from_dict(data: dict[str, Any]) -> RunState:
    r = dict(data["record"])
    record = LaunchRecord(
        engine=r["engine"], pid=int(r["pid"]), pgid=int(r["pgid"]), create_time=float(r["create_time"]),
        argv=tuple(r["argv"]), host=r["host"], port=int(r["port"]), url=r["url"],
        gpus=tuple(int(g) for g in r["gpus"]),
        baseline_mib={int(k): int(v) for k, v in r["baseline_mib"].items()},
        engine_version=r.get("engine_version"), started_at=float(r["started_at"]), log_path=r["log_path"],
        stop_grace=float(r["stop_grace"]), stop_deadline=float(r["stop_deadline"]),
        launcher_pid=int(r.get("launcher_pid", 0)), launch=int(r.get("launch") or 0),
    )
    watcher = data.get("watcher")
    return RunState(
        record=record,
        status=RunStatus(data["status"]),
        descendants=tuple(_ref_from(d) for d in data.get("descendants", [])),
        updated_at=float(data.get("updated_at", 0.0)),
        watcher=_ref_from(watcher) if watcher else None,
        kv_capacity_tokens=data.get("kv_capacity_tokens"),
        note=data.get("note"),
    )


class StateFile:
    """``RUN_DIR/launch.json``: read, written atomically (0600), updated under a file lock.

    Every access goes through the run folder held once (:class:`harvest.safefiles.Folder`): given
    as one, or held at first use (and refused then unless it is this user's own). A rename or a
    symlink put in the folder's place afterwards cannot point a stop at another server's record.
    """

    def __init__(self, run_dir: Path | str | safefiles.Folder, lock_timeout: float | None = None):
        if isinstance(run_dir, safefiles.Folder):
            self._folder: safefiles.Folder | None = run_dir
            self._own_folder = False
            self.run_dir = run_dir.path
        else:
            self._folder = None
            self._own_folder = True
            self.run_dir = Path(run_dir)
        self.path = self.run_dir / STATE_FILE
        self._lock_name = LOCK_FILE
        self._lock_path = self.run_dir / self._lock_name
        #: Longest a write waits for the lock (None: as long as it takes). A stop sets it: a process
        #: frozen while holding the lock must not hold the stop past its deadline.
        self.lock_timeout = lock_timeout

    @property
    def log_path(self) -> Path:
        return self.run_dir / LOG_FILE

    @property
    def stop_path(self) -> Path:
        return self.run_dir / STOP_FILE

    def folder(self) -> safefiles.Folder:
        """The run folder, held (at the first call when this file was given a path)."""
        if self._folder is None:
            self._folder = safefiles.hold(self.run_dir)
        return self._folder

    def close(self) -> None:
        """Let go of the run folder if this file held it itself."""
        if self._own_folder and self._folder is not None:
            self._folder.close()
            self._folder = None

    def exists(self) -> bool:
        try:
            st = self.folder().lstat(STATE_FILE)
        except UnsafePathError:
            return self.path.is_file()  # a folder read() refuses; say what is there
        return st is not None and stat.S_ISREG(st.st_mode)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = self.folder().open(self._lock_name, os.O_RDWR | os.O_CREAT)
        try:
            if self.lock_timeout is None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            else:
                end = time.monotonic() + self.lock_timeout
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() >= end:
                            raise TimeoutError(f"{self._lock_path} stayed locked by another process for "
                                               f"{self.lock_timeout:g} s") from None
                        time.sleep(0.01)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def read(self) -> RunState:
        """The recorded state. Raises :class:`StopError` when there is none or it cannot be read."""
        try:
            data = json.loads(self.folder().read_text(STATE_FILE))
            return state_from_dict(data)
        except UnsafePathError as exc:  # a folder or record another user could have written
            raise StopError(f"refused launch record: {exc}") from None
        except FileNotFoundError:
            raise StopError(f"no launch record in {self.run_dir} ({STATE_FILE} missing)") from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StopError(f"unreadable launch record {self.path}: {exc}") from None

    def write(self, state: RunState) -> RunState:
        state = replace(state, updated_at=time.time())
        with self._locked():
            self.folder().write_atomic(STATE_FILE, json.dumps(state_to_dict(state), indent=2) + "\n")
        return state

    def update(self, change: Callable[[RunState], RunState]) -> RunState:
        """Read, change and write back under the lock (the recorder and a stop may race)."""
        with self._locked():
            before = self.read()
            changed = change(before)
            if changed is before:
                return before  # nothing to record: no write
            state = replace(changed, updated_at=time.time())
            self.folder().write_atomic(STATE_FILE, json.dumps(state_to_dict(state), indent=2) + "\n")
            return state

    def add_descendants(self, found: Sequence[ProcessRef],
                        keep: Callable[[ProcessRef], bool] | None = None) -> RunState:
        """Record processes not recorded yet (same pid and create time = same process).

        ``keep``, when given, decides which already-recorded descendants stay (the recorder drops
        those that have exited, so the file does not grow with every short-lived helper).
        """

        def change(state: RunState) -> RunState:
            kept = state.descendants if keep is None else tuple(d for d in state.descendants if keep(d))
            known = (state.record.leader, *kept)
            new: list[ProcessRef] = []
            for p in found:
                if not any(k.pid == p.pid and abs(k.create_time - p.create_time) <= 0.05 for k in (*known, *new)):
                    new.append(p)
            if not new and len(kept) == len(state.descendants):
                return state
            return replace(state, descendants=kept + tuple(new))

        return self.update(change)

    def set_status(self, status: RunStatus, note: str | None = None) -> RunState:
        return self.update(lambda s: replace(s, status=status, note=note if note is not None else s.note))

    def write_stop_report(self, report: dict[str, Any]) -> None:
        self.folder().write_atomic(STOP_FILE, json.dumps(report, indent=2) + "\n")


# --- the user-wide index of run folders -------------------------------------------------------


def state_dir() -> Path:
    """Where harvest keeps user-wide state (not created here)."""
    env = os.environ.get("HARVEST_STATE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state"
    return base / "harvest"


def default_run_dir(engine: str, port: int) -> Path:
    """A fresh run folder under the state dir for a server launched without ``--run-dir``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return state_dir() / "servers" / f"{stamp}-{engine}-{port}-{os.getpid()}"


@dataclass(frozen=True)
class IndexEntry:
    """One line of the index: a run folder harvest launched a server in."""

    run_dir: str
    engine: str
    port: int
    registered_at: float
    name: str = field(default="", compare=False)


def hold_index() -> safefiles.Folder:
    """The state dir's ``runs/``, held (both created 0700 when absent). A state dir another user
    owns or can write to is refused here: commands that launch a server call this before they
    launch anything."""
    with safefiles.hold(state_dir(), create=True) as top:
        return top.subfolder("runs")


def register_run(run_dir: Path, engine: str, port: int, index: safefiles.Folder | None = None) -> IndexEntry:
    """Add a run folder to the index (one small 0600 file per run), in ``index`` when given (the
    folder :func:`hold_index` returned before the launch)."""
    runs = index if index is not None else hold_index()
    try:
        now = time.time()
        name = f"{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}-{os.getpid()}-{int(now * 1e6) % 1000000}"
        entry = IndexEntry(str(Path(run_dir).resolve()), engine, port, now, name)
        runs.write_atomic(f"{name}.json", json.dumps(asdict(entry)) + "\n")
    finally:
        if index is None:
            runs.close()
    return entry


def list_runs() -> list[IndexEntry]:
    """Every indexed run folder once (its latest registration: a folder whose server was launched
    again, by a relaunch or a later session, is registered at each launch), oldest first; entries
    whose folder is gone are skipped."""
    runs = state_dir() / "runs"
    out: list[IndexEntry] = []
    if not runs.is_dir():
        return out
    with safefiles.hold(runs) as held:
        names = sorted(n for n in os.listdir(held.fd) if n.endswith(".json"))
        docs = []
        for n in names:
            try:
                docs.append((n, held.read_text(n)))
            except (OSError, UnsafePathError):
                continue
    for n, text in docs:
        f = runs / n
        try:
            d = json.loads(text)
            entry = IndexEntry(d["run_dir"], d["engine"], int(d["port"]), float(d["registered_at"]), f.stem)
        except (OSError, ValueError, KeyError, TypeError, UnsafePathError):
            continue
        if Path(entry.run_dir).is_dir():
            out.append(entry)
    latest = {e.run_dir: e for e in sorted(out, key=lambda e: e.registered_at)}
    return sorted(latest.values(), key=lambda e: e.registered_at)


__all__ = [
    "IndexEntry",
    "LOG_FILE",
    "LaunchRecord",
    "RUN_FILES",
    "ProcessRef",
    "RunState",
    "RunStatus",
    "STATE_FILE",
    "StateFile",
    "WATCH_LOG",
    "check_run_files",
    "default_run_dir",
    "hold_index",
    "list_runs",
    "make_run_dir",
    "redact_argv",
    "register_run",
    "state_dir",
]
