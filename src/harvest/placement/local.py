"""Placement ``local``: servers on this machine, supervised by this process (or a detached watcher).

The verbs are the ones every kind offers (:mod:`harvest.placement.base`); here they call
:mod:`harvest.server` and :mod:`harvest.gpu` directly. The record of a launch is the supervisor's
own ``launch.json``; a stop by it signals only the recorded group and (pid, create time) pairs.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import psutil

from harvest import safefiles
from harvest.checks import NamedPath
from harvest.config import HarvestConfig, PreflightConfig, ServerConfig
from harvest.errors import StopError
from harvest.events import Listener
from harvest.gpu import NoGpuProbe, host_state, open_probe, run_preflight, wait_for_preflight
from harvest.gpu.paths import data_paths
from harvest.gpu.payload import gpus_payload, preflight_payload
from harvest.gpu.records import GpuProbe
from harvest.net import port_listening
from harvest.placement import record
from harvest.placement.base import (
    Answer,
    Fleet,
    FleetFactory,
    NothingToStop,
    OnPreflight,
    Placement,
    Readiness,
    Refused,
)
from harvest.placement.base_results import GpusByPlace, PreflightByPlace
from harvest.server import (
    DEFAULT_MARGIN_MIB,
    LaunchRecord,
    ProcessRef,
    RunState,
    RunStatus,
    Server,
    StateFile,
    StopReport,
    StopStep,
    WATCH_LOG,
    alive,
    check_run_dir,
    engine_paths,
    group_findings,
    hold_index,
    list_runs,
    stop_run,
)

log = logging.getLogger("harvest.placement")


def job_paths(cfg: HarvestConfig) -> tuple[NamedPath, ...]:
    """What a job run here needs on this machine: the engine's paths and the data harvest reads."""
    return (engine_paths(cfg.server) if cfg.server is not None else ()) + data_paths(cfg.data)

WHERE = "this machine"


def spawn_watcher(run_dir: Path) -> ProcessRef:
    """Start the watcher of a detached server (``python -m harvest.server.watch RUN_DIR``) in its own
    session; its output goes to ``watch.log`` in the run folder."""
    out = safefiles.open_text(run_dir / WATCH_LOG, "ab")
    try:
        p = subprocess.Popen([sys.executable, "-m", "harvest.server.watch", str(run_dir)], stdin=subprocess.DEVNULL,
                             stdout=out, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    finally:
        out.close()
    return ProcessRef(p.pid, psutil.Process(p.pid).create_time(), "harvest-watch")


class LocalFleet(Fleet):
    """One supervised :class:`~harvest.server.Server` on this machine (it reports its own phases)."""

    emits = False

    def __init__(self, server: Server, *, on_event: Listener | None = None):
        super().__init__(server.config, run_dir=server.run_dir, where=WHERE, on_event=on_event, server=server)
        self.server = server

    @property
    def urls(self) -> list[str]:
        return [self.server.url]

    @property
    def ready(self) -> Readiness | None:
        got = self.server.ready
        return Readiness(got.seconds) if got is not None else None

    @property
    def kv_capacity_tokens(self) -> int | None:
        return self.server.kv_capacity_tokens

    @property
    def client_config(self) -> ServerConfig:
        return self.server.config

    def placed(self) -> list[dict[str, Any]]:
        return [{"where": WHERE, "pid": self.server.pid, "url": self.url}]

    def returncode(self) -> int | None:
        return self.server.returncode()

    def cancel(self) -> None:
        self.server.cancel()

    def listen(self, on_event: Listener | None) -> None:
        super().listen(on_event)
        self.server.on_event = on_event

    def launch_record(self) -> LaunchRecord | None:
        try:
            return self.server.state().record
        except (StopError, OSError, ValueError):  # nothing launched yet, or a record that cannot be read
            return None

    def stopped_elsewhere(self) -> bool:
        try:
            status = self.server.state().status
        except StopError:
            return False
        return status in (RunStatus.STOPPING, RunStatus.STOPPED, RunStatus.DIRTY)

    def detach(self) -> None:
        """A watcher keeps recording the server's descendants; the supervisor lets go of it."""
        self.server.record_watcher(spawn_watcher(self.run_dir))
        self.server.detach()


class LocalPlacement(Placement):
    """Servers on this machine."""

    kind: ClassVar[str] = "local"
    here: ClassVar[bool] = True

    def where(self) -> str:
        return WHERE

    def _measure(self, probe: GpuProbe) -> GpusByPlace:
        here = probe.snapshot(), host_state()
        return GpusByPlace(self.kind, WHERE, "host", "", (Answer(WHERE, gpus_payload(*here)),), here=here)

    def gpus(self) -> GpusByPlace:
        """This machine now; raises ProbeError when the GPUs cannot be measured."""
        probe = open_probe()
        try:
            return self._measure(probe)
        finally:
            probe.close()

    @contextlib.contextmanager
    def gpus_live(self) -> Iterator[Callable[[], GpusByPlace]]:
        probe = open_probe()
        try:
            yield lambda: self._measure(probe)
        finally:
            probe.close()

    def preflight(self, cfg: HarvestConfig, *, output_dir: Path | None = None, wait_s: float | None = None,
                  on_wait: Callable[[], None] | None = None) -> PreflightByPlace:
        server = cfg.require_server()
        out_dir = output_dir if output_dir is not None else Path(cfg.output.dir)
        # NVML is only opened when a rule will look at a GPU.
        probe = open_probe() if (server.launched and server.gpus) else NoGpuProbe("no GPUs listed")
        paths = job_paths(cfg)
        try:
            if wait_s is None:
                report = run_preflight(server, cfg.preflight, probe=probe, output_dir=out_dir, paths=paths)
            else:
                if on_wait is not None:
                    on_wait()
                report = wait_for_preflight(server, cfg.preflight, probe=probe, output_dir=out_dir, wait_s=wait_s,
                                            paths=paths)
        finally:
            probe.close()
        answer = Answer(WHERE, preflight_payload(report, config=cfg.source, engine=server.engine))
        return PreflightByPlace(self.kind, WHERE, "host", "", cfg.source, server.engine, (answer,), here=report)

    def fleet(self, *, probe: bool = False, all_hosts: bool = False) -> FleetFactory:
        def make(cfg: ServerConfig, *, run_dir: Path | safefiles.Folder, preflight: PreflightConfig | None = None,
                 force: bool = False, on_preflight: OnPreflight | None = None,
                 on_event: Listener | None = None) -> Fleet:
            return LocalFleet(Server(cfg, run_dir=run_dir, preflight=preflight, force=force, on_preflight=on_preflight,
                                     on_event=on_event), on_event=on_event)

        return make

    def hold_state_dir(self) -> None:
        hold_index().close()  # a state dir another user owns: refused before anything is written

    def check_records(self, server_dir: Path | safefiles.Folder, server: ServerConfig) -> None:
        """The supervisor's files in ``server_dir`` (its launch record, lock, log, stop report, the
        watcher's log, the engine's private files) and the folder itself, as a launch checks them."""
        check_run_dir(server_dir, server)

    def ps(self, show_all: bool) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for e in list_runs():
            try:
                state = StateFile(e.run_dir).read()
            except StopError:
                continue
            live = alive(state.processes())
            listening = port_listening(state.record.host, state.record.port, timeout=0.2)
            if not show_all and not live and state.status in (RunStatus.STOPPED, RunStatus.FAILED):
                continue
            rec = state.record
            rows.append({
                "where": WHERE, "run_dir": e.run_dir, "engine": rec.engine, "url": rec.url, "pid": rec.pid,
                "port": rec.port, "gpus": list(rec.gpus), "started_at": rec.started_at,
                "recorded": {"status": state.status.value, "processes": len(state.processes())},
                "measured": {"leader_alive": any(r.pid == rec.pid for r in live), "alive": len(live),
                             "port_listening": listening},
            })
        return rows

    def running(self) -> list[tuple[str, RunState]]:
        """(run folder, state) of every server harvest started here whose processes are alive."""
        out = []
        for e in list_runs():
            try:
                state = StateFile(e.run_dir).read()
            except StopError:
                continue
            if alive(state.processes()):
                out.append((e.run_dir, state))
        return out

    def stop(self, run_dir: Path | None, *, deadline: float | None = None, grace: float | None = None,
             margin_mib: int = DEFAULT_MARGIN_MIB,
             on_step: Callable[[str, StopStep | None], None] | None = None) -> list[StopReport]:
        """The verified stop of the server recorded in ``run_dir`` (or its ``server/``); with no
        ``run_dir``, of the only one running. Raises StopError / Refused when there is nothing to stop."""
        if run_dir is None:
            running = self.running()
            if not running:
                raise NothingToStop("harvest stop", "nothing to stop: no server harvest started is running")
            if len(running) > 1:
                names = "; ".join(f"{folder} ({st.record.engine} pid {st.record.pid})" for folder, st in running)
                raise Refused("harvest stop", f"several servers are running, name the run folder: {names}")
            run_dir = Path(running[0][0])
        folder = record.local_record_dir(run_dir) or Path(run_dir)
        return [stop_run(folder, deadline=deadline, grace=grace, margin_mib=margin_mib, on_step=on_step)]

    def leftovers(self, server_dir: Path | safefiles.Folder) -> list[StopReport]:
        state_file = StateFile(server_dir)
        if not state_file.exists():
            return []
        try:
            state = state_file.read()
            if state.status is RunStatus.STOPPED:
                return []
            # Signals go only where a recorded process, create time verified, is alive (the proof);
            # otherwise the stop signals nothing and only measures, and this says what it found.
            proven = alive(state.processes())
            report = stop_run(state_file.folder())  # the folder the record was just read through
        except StopError as exc:  # no readable record: nothing is provably ours to stop
            log.warning("a server record of an earlier session is unreadable, not stopped: %s", exc)
            return []
        finally:
            state_file.close()
        verdict = "clean" if report.clean else "DIRTY: " + "; ".join(report.problems)
        if proven:
            log.warning("stopped the server left running by an earlier session of this run (pid %s): %s",
                        ", ".join(str(r.pid) for r in proven), verdict)
        else:
            log.warning("the server record of an earlier session of this run names no process still running "
                        "(%s); nothing was signalled; measured: %s", group_findings(state), verdict)
        return [report]


__all__ = ["LocalFleet", "LocalPlacement", "WHERE", "spawn_watcher"]
