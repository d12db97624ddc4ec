"""Who runs a run folder now, and how its last session ended: ``runner.json``, and its stop.

    record = RunnerRecord.mine(detached=True, log="run.log", stop_s=90)   # a session begins
    write(folder, record)                                                # through the held folder
    write(folder, record.ended("finished", 0))                           # ... and ends
    found = read(run_dir)                    # another process: the record, or None
    alive(found)                             # measured: that pid, with that create time, runs
    outcome = stop(found, deadline_s=90)     # ``harvest stop RUN_DIR``: as Ctrl-C, then verified

Every session of ``harvest run`` writes ``runner.json`` (mode 0600, replaced atomically, through the
run folder it holds): its pid and create time (so a reused pid is never taken for it), whether it
runs detached and where its output goes, and, once it ends, its outcome and exit code. ``harvest
status --watch`` ends with that exit code; ``harvest stop RUN_DIR`` stops the runner it names.

The stop asks the runner to stop as Ctrl-C does (SIGTERM: the session releases the items in flight
back to pending, uncharged, and gives its servers their verified stop), waits for it to exit
within its deadline, and only then, if it is still there, ends it with SIGKILL (verified by pid and
create time, through :mod:`harvest.server.procs`) and says so: its servers are then left to the
caller's stop by their records, and its items left running go back to pending at the next resume.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import psutil

from harvest import safefiles, schemas
from harvest.errors import UnsafePathError
from harvest.redact import redact_argv
from harvest.server import signal_verified, verified
from harvest.stops import ProcessRef

RUNNER_FILE = "runner.json"
#: The output of a detached run, in its run folder.
RUN_LOG = "run.log"
#: How often a stop looks whether the runner has exited.
POLL_S = 0.1
#: Seconds a stop waits for the runner after a SIGKILL (the kernel's part).
KILL_WAIT_S = 5.0


@dataclass(frozen=True)
class RunnerRecord:
    """The process that runs (or ran) a run folder's last session."""

    pid: int
    create_time: float
    started_at: float
    #: Started by ``harvest run --detach``: its own session, its output in :attr:`log`.
    detached: bool = False
    #: The run log's name in the run folder (detached runs), else None.
    log: str | None = None
    #: The command line it runs (secrets hidden), to say how to run it again.
    argv: tuple[str, ...] = ()
    #: Seconds its stop may take: the servers' verified stops and a margin.
    stop_s: float = 60.0
    #: Where its ``/metrics`` is served (``[client] metrics_port``), else None.
    metrics: str | None = None
    #: Once the session ended: when, how (the session's outcome) and the exit code it exits with.
    ended_at: float | None = None
    outcome: str | None = None
    exit_code: int | None = None
    note: str | None = None

    @classmethod
    def mine(cls, *, detached: bool = False, log: str | None = None, stop_s: float = 60.0,
             argv: tuple[str, ...] = (), metrics: str | None = None) -> RunnerRecord:
        """The record of this process, starting a session now."""
        return cls(os.getpid(), psutil.Process().create_time(), time.time(), detached, log,
                   tuple(redact_argv(argv)), stop_s, metrics)

    @property
    def ref(self) -> ProcessRef:
        return ProcessRef(self.pid, self.create_time, "harvest")

    def ended(self, outcome: str, exit_code: int, note: str | None = None) -> RunnerRecord:
        return replace(self, ended_at=time.time(), outcome=outcome, exit_code=exit_code, note=note)

    def to_doc(self) -> dict[str, Any]:
        return {"schema": schemas.RUNNER, **asdict(self), "argv": list(self.argv)}

    @classmethod
    def from_doc(cls, doc: Any) -> RunnerRecord | None:
        """The record in a document another process wrote (None when it is not one)."""
        if not isinstance(doc, dict) or doc.get("schema") != schemas.RUNNER:
            return None
        try:
            return cls(int(doc["pid"]), float(doc["create_time"]), float(doc["started_at"]), bool(doc.get("detached")),
                       _text(doc.get("log")), tuple(str(a) for a in doc.get("argv") or ()),
                       float(doc.get("stop_s") or 60.0), _text(doc.get("metrics")), _num(doc.get("ended_at")),
                       _text(doc.get("outcome")),
                       int(doc["exit_code"]) if isinstance(doc.get("exit_code"), int) else None, _text(doc.get("note")))
        except (KeyError, TypeError, ValueError):
            return None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def write(folder: safefiles.Folder, record: RunnerRecord) -> None:
    """``runner.json`` replaced (0600) through the held run folder."""
    folder.write_atomic(RUNNER_FILE, json.dumps(record.to_doc(), indent=1) + "\n", fsync=False)


def read(run_dir: Path | str | safefiles.Folder) -> RunnerRecord | None:
    """The runner record of a run folder (None when it has none, or one that is not a record:
    another user's file, a link, a document of another shape are never taken for one)."""
    try:
        if isinstance(run_dir, safefiles.Folder):
            text = run_dir.read_text(RUNNER_FILE)
        else:
            text = safefiles.read_text(Path(run_dir) / RUNNER_FILE)
        return RunnerRecord.from_doc(json.loads(text))
    except (OSError, ValueError, UnsafePathError):
        return None


def alive(record: RunnerRecord | None) -> bool:
    """Measured: the recorded process runs (same pid, same create time), not a zombie."""
    return record is not None and verified(record.ref) is not None


@dataclass(frozen=True)
class RunnerStop:
    """What a stop of a runner did and measured."""

    pid: int
    #: The stop request (SIGTERM) was sent; False when the runner had exited already.
    asked: bool
    #: Seconds until the runner was measured gone (None: it was not, by the end).
    exited_after_s: float | None
    #: It outlived its deadline and was sent SIGKILL.
    killed: bool = False
    #: Gone at the end (measured).
    gone: bool = True


def stop(record: RunnerRecord, *, deadline_s: float | None = None) -> RunnerStop:
    """Stop the runner of ``record`` as Ctrl-C does (see the module docstring), waiting at most
    ``deadline_s`` (default: the record's ``stop_s``) for it to exit before its SIGKILL."""
    t0 = time.monotonic()
    if not alive(record):
        return RunnerStop(record.pid, False, 0.0)
    asked = bool(signal_verified([record.ref], signal.SIGTERM))
    wait = record.stop_s if deadline_s is None else deadline_s
    if _gone_within(record, wait):
        return RunnerStop(record.pid, asked, round(time.monotonic() - t0, 3))
    killed = bool(signal_verified([record.ref], signal.SIGKILL))
    gone = _gone_within(record, KILL_WAIT_S)
    return RunnerStop(record.pid, asked, None, killed, gone)


def _gone_within(record: RunnerRecord, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while alive(record):
        if time.monotonic() >= end:
            return False
        time.sleep(POLL_S)
    return True


__all__ = ["RUNNER_FILE", "RUN_LOG", "RunnerRecord", "RunnerStop", "alive", "read", "stop", "write"]
