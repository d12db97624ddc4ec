"""Placement ``local``: servers on this machine, supervised by this process (or a detached watcher).

The verbs are the ones every kind offers (:mod:`harvest.placement.base`); here they call
:mod:`harvest.server` and :mod:`harvest.gpu` directly. The record of a launch is the supervisor's
own ``launch.json``; a stop by it signals only the recorded group and (pid, create time) pairs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from harvest.config import HarvestConfig
from harvest.errors import StopError
from harvest.gpu import NoGpuProbe, open_probe, run_preflight, wait_for_preflight
from harvest.gpu.payload import gpus_payload, preflight_payload
from harvest.gpu.preflight import PreflightReport
from harvest.net import port_listening
from harvest.placement import record
from harvest.placement.base import Answer, Fleet, NothingToStop, Refused, fleet_factory
from harvest.placement.base_results import GpusByPlace, PreflightByPlace
from harvest.server import Server, StopReport, procs
from harvest.server.state import RunStatus, StateFile, list_runs
from harvest.server.stop import DEFAULT_MARGIN_MIB, StopStep, stop_run

log = logging.getLogger("harvest.placement")

WHERE = "this machine"


@dataclass(frozen=True)
class LocalPreflight:
    """This machine's preflight report of one [server]."""

    report: PreflightReport
    config: str
    engine: str

    @property
    def passed(self) -> bool:
        return self.report.passed

    def to_json(self) -> dict[str, Any]:
        """``harvest.preflight/2`` with this machine as its one place."""
        answer = Answer(WHERE, preflight_payload(self.report, config=self.config, engine=self.engine))
        return PreflightByPlace("local", WHERE, "host", "", self.config, self.engine, (answer,)).to_json()


class LocalPlacement:
    """Servers on this machine."""

    kind: ClassVar[str] = "local"

    def where(self) -> str:
        return WHERE

    def gpus(self) -> Any:
        """``(snapshot, host state)`` now; raises ProbeError when the GPUs cannot be measured."""
        from harvest.gpu import host_state

        probe = open_probe()
        try:
            return probe.snapshot(), host_state()
        finally:
            probe.close()

    def gpus_json(self, got: Any) -> dict[str, Any]:
        """``harvest.gpus/2`` with this machine as its one place, of a ``gpus()`` measurement."""
        return GpusByPlace(self.kind, WHERE, "host", "", (Answer(WHERE, gpus_payload(*got)),)).to_json()

    def preflight(self, cfg: HarvestConfig, *, output_dir: Path | None = None, wait_s: float | None = None,
                  on_wait: Callable[[], None] | None = None) -> LocalPreflight:
        server = cfg.require_server()
        out_dir = output_dir if output_dir is not None else Path(cfg.output.dir)
        # NVML is only opened when a rule will look at a GPU.
        probe = open_probe() if (server.launched and server.gpus) else NoGpuProbe("no GPUs listed")
        try:
            if wait_s is None:
                report = run_preflight(server, cfg.preflight, probe=probe, output_dir=out_dir)
            else:
                if on_wait is not None:
                    on_wait()
                report = wait_for_preflight(server, cfg.preflight, probe=probe, output_dir=out_dir, wait_s=wait_s)
        finally:
            probe.close()
        return LocalPreflight(report, cfg.source, server.engine)

    def fleet(self, *, probe: bool = False, all_hosts: bool = False) -> Any:
        def make(cfg: Any, *, run_dir: Path, **kw: Any) -> Server:
            return Server(cfg, run_dir=run_dir, **kw)

        return fleet_factory(make, where=WHERE, emits=False)

    def server(self, cfg: Any, **kw: Any) -> Fleet:
        """One supervised server (``harvest serve``), as a Fleet."""
        return self.fleet()(cfg, **kw)

    def ps(self, show_all: bool) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for e in list_runs():
            try:
                state = StateFile(e.run_dir).read()
            except StopError:
                continue
            live = procs.alive(state.processes())
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

    def running(self) -> list[tuple[Any, Any]]:
        """(index entry, state) of every server harvest started here whose processes are alive."""
        out = []
        for e in list_runs():
            try:
                state = StateFile(e.run_dir).read()
            except StopError:
                continue
            if procs.alive(state.processes()):
                out.append((e, state))
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
                names = "; ".join(f"{e.run_dir} ({st.record.engine} pid {st.record.pid})" for e, st in running)
                raise Refused("harvest stop", f"several servers are running, name the run folder: {names}")
            run_dir = Path(running[0][0].run_dir)
        folder = record.local_record_dir(run_dir) or Path(run_dir)
        return [stop_run(folder, deadline=deadline, grace=grace, margin_mib=margin_mib, on_step=on_step)]

    def leftovers(self, server_dir: Path) -> list[StopReport]:
        state_file = StateFile(server_dir)
        if not state_file.exists():
            return []
        try:
            state = state_file.read()
            if state.status is RunStatus.STOPPED:
                return []
            # Signals go only where a recorded process, create time verified, is alive (the proof);
            # otherwise the stop signals nothing and only measures, and this says what it found.
            proven = procs.alive(state.processes())
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
                        "(%s); nothing was signalled; measured: %s", procs.group_findings(state), verdict)
        return [report]


__all__ = ["LocalPlacement", "LocalPreflight", "WHERE"]
