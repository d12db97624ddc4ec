"""``harvest serve``, ``harvest stop`` and ``harvest ps``: supervised launch, verified stop, listing.

    harvest serve CONFIG [--run-dir D | --run-name N] [--detach [--json]] [--force] [--give-up-after S]
                                                                         (CONFIG "-": read from stdin)
    harvest stop [RUN_DIR] [--deadline S] [--json] [--config F | --host USER@NAME ...]
    harvest ps [--all] [--json] [--config F | --host USER@NAME ...]

With a ``[host]`` in CONFIG (or in ``--config F``, or given by ``--host`` and its flags, see
:func:`harvest.cli.remote.host_options`) the far harvest does the work: see
:mod:`harvest.cli.remote`. A RUN_DIR holding a near record of a far server (``remote.json``)
is stopped on its far host.

Exit codes: serve 0 after a clean stop (or once detached), 1 when refused by preflight, when the
engine failed to start or exited on its own, or when the stop was dirty, 130 when interrupted
during start-up; stop 0 clean, 1 dirty, 2 nothing to stop or no readable record. This module parses
options and renders; launching and stopping live in :mod:`harvest.server`, and nothing here
signals a process itself.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click
import psutil
from rich.console import Console

from harvest import safefiles
from harvest.cli.live import PhaseDisplay, setup_console_logging
from harvest.cli.remote import host_options
from harvest.cli.render import make_console, rule_line
from harvest.config import HostConfig
from harvest.errors import LaunchError, PreflightFailed, StopError
from harvest.events import Event
from harvest.server import procs
from harvest.server.state import (
    IndexEntry,
    ProcessRef,
    RunState,
    RunStatus,
    StateFile,
    default_run_dir,
    list_runs,
    state_dir,
)
from harvest.server.stop import DEFAULT_MARGIN_MIB, StopReport, StopStep, stop_run
from harvest.server.supervisor import Server

SERVE_SCHEMA = "harvest.serve/2"
STOP_SCHEMA = "harvest.stop/1"
PS_SCHEMA = "harvest.ps/1"


def step_line(step: StopStep) -> str:
    mark = "" if step.ok else "  <-- incomplete"
    return f"  {step.name:<8} {step.duration_s:7.3f} s  {step.outcome}{mark}"


def print_stop_report(report: StopReport, *, err: bool = False, console: Console | None = None,
                      steps_shown: bool = False) -> None:
    """The stop's steps, holders, problems and verdict (``steps_shown``: the steps were already
    printed as they happened, only the rest is left)."""
    console = console or make_console(stderr=err)
    if not steps_shown:
        console.print(f"stop of {report.run_dir}:", markup=False)
        for step in report.steps:
            console.print(step_line(step), markup=False)
    for h in report.holders:
        who = "ours" if h.ours else "not ours"
        mib = f"{h.used_mib} MiB" if h.used_mib is not None else "MiB unknown"
        console.print(f"  holder: GPU {h.gpu} pid {h.pid} {h.name or '?'} {mib} ({who})", markup=False)
    for p in report.problems:
        console.print(f"  problem: {p}", markup=False)
    esc = ", escalated to SIGKILL" if report.escalated else ""
    console.print(f"verdict: {report.verdict.upper()} in {report.total_s:.2f} s "
                  f"(deadline {report.deadline_s:g} s{esc})", markup=False)


def _spawn_watcher(run_dir: Path) -> ProcessRef:
    log = safefiles.open_text(run_dir / "watch.log", "ab")
    try:
        p = subprocess.Popen([sys.executable, "-m", "harvest.server.watch", str(run_dir)], stdin=subprocess.DEVNULL,
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    finally:
        log.close()
    return ProcessRef(p.pid, psutil.Process(p.pid).create_time(), "harvest-watch")


@click.command("serve")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="folder for the launch record and the server log (default: a new one under the state dir)")
@click.option("--detach", is_flag=True, help="return once the server is ready and leave it running")
@click.option("--force", is_flag=True, help="launch even when preflight fails (the failures are still printed)")
@click.option("--json", "as_json", is_flag=True,
              help=f"with --detach: print the launch as JSON ({SERVE_SCHEMA}) on stdout, the rest on stderr")
@click.option("--run-name", default=None, metavar="NAME",
              help="the run folder is NAME under the state dir's servers/ (a near harvest names it before "
                   "a far launch, to find it again)")
@click.option("--give-up-after", type=click.FloatRange(min=0.1), default=None, metavar="SECONDS",
              help="give up the launch (and stop what it started) unless ready this many seconds after start")
def serve(config: Path, run_dir: Path | None, detach: bool, force: bool, as_json: bool, run_name: str | None,
          give_up_after: float | None) -> None:
    """Launch the [server] of CONFIG supervised; Ctrl-C (or SIGTERM) stops it with verification."""
    from harvest.cli.remote import load_config_arg, remote_serve

    cfg = load_config_arg(config)
    server_cfg = cfg.require_server()
    err = make_console(stderr=True)
    if as_json and not detach:
        err.print("error: --json needs --detach", markup=False)
        sys.exit(2)
    if cfg.far_hosts():
        if run_name is not None or give_up_after is not None:
            err.print("error: --run-name and --give-up-after are what harvest passes to the far serve; with "
                      "[host] it chooses both itself", markup=False)
            sys.exit(2)
        remote_serve(cfg, run_dir, detach, force)
        return
    setup_console_logging(err)  # log records print above the live panel, never into it
    if not server_cfg.launched:
        err.print(f"error: engine '{server_cfg.engine}' is a running endpoint; harvest does not launch it",
                  markup=False)
        sys.exit(2)
    if run_name is not None:
        run_dir = _named_run_dir(run_name, run_dir, err)
    run_dir = run_dir if run_dir is not None else default_run_dir(server_cfg.engine, server_cfg.port)

    def show_preflight(report: Any) -> None:
        if not report.passed and force:
            err.print("preflight FAILED, launching anyway (--force):", markup=False)
            for r in report.failures:
                err.print(rule_line(r))

    display = PhaseDisplay(err, f"harvest serve: {server_cfg.engine} on {server_cfg.url}")
    server = Server(server_cfg, run_dir=run_dir, preflight=cfg.preflight, force=force, on_preflight=show_preflight,
                    on_event=display.on_event)
    stop_requested = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop_requested.set()
        server.cancel()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    gave_up = threading.Event()
    timer = None
    if give_up_after is not None:  # the launch (preflight included) is cancelled past this point

        def give_up() -> None:
            gave_up.set()
            server.cancel()

        timer = threading.Timer(give_up_after, give_up)
        timer.daemon = True
        timer.start()
    try:
        err.print(f"launching {server_cfg.engine} on {server_cfg.url} (run dir {run_dir})", markup=False)
        try:
            with display:  # the launch phases, live; a failed start-up's stop shows there too
                server.launch()
            if timer is not None:
                timer.cancel()
        except PreflightFailed as exc:
            err.print("refused to launch: preflight failed (use --force to launch anyway)", markup=False)
            for r in exc.results:
                if not getattr(r, "passed", True):
                    err.print(rule_line(r))  # type: ignore[arg-type]
            sys.exit(1)
        except LaunchError as exc:
            if gave_up.is_set() and not stop_requested.is_set():
                err.print(f"launch failed: not ready within --give-up-after {give_up_after:g} s; gave up "
                          f"({str(exc).splitlines()[0]})", markup=False)
            else:
                err.print(f"launch failed: {exc}", markup=False)
            if server.stop_report is not None:
                print_stop_report(server.stop_report, err=True)
            sys.exit(130 if exc.reason == "cancelled" and not gave_up.is_set() else 1)
        ready = server.ready
        kv = server.kv_capacity_tokens
        click.echo(f"ready: {server.url} pid {server.pid} in {ready.seconds if ready else 0:.1f} s"
                   + (f", KV capacity {kv} tokens" if kv is not None else "") + f"; run dir {run_dir}",
                   err=as_json)
        if detach:
            server.record_watcher(_spawn_watcher(Path(run_dir)))
            server.detach()
            if as_json:
                click.echo(json.dumps({"schema": SERVE_SCHEMA, "run_dir": str(Path(run_dir).resolve()),
                                       "engine": server_cfg.engine, "url": server.url, "host": server_cfg.host,
                                       "port": server_cfg.port, "pid": server.pid,
                                       "ready_s": ready.seconds if ready else 0.0, "kv_capacity_tokens": kv}))
            else:
                click.echo(f"detached; stop it with: harvest stop {run_dir}")
            return
        exited_itself: int | None = None
        while not stop_requested.wait(0.5):
            code = server.returncode()
            if code is None:
                continue
            if server.state().status in (RunStatus.STOPPING, RunStatus.STOPPED, RunStatus.DIRTY):
                err.print("stopped by `harvest stop` from another process; verifying cleanup", markup=False)
            else:
                exited_itself = code
                err.print(f"the engine exited on its own with code {code}; verifying cleanup", markup=False)
            break
        stopping = PhaseDisplay(err, f"harvest serve: stopping {server_cfg.engine} pid {server.pid}")
        server.on_event = stopping.on_event
        with stopping:  # the stop's steps, live
            report = server.shutdown()
        if report is not None:
            print_stop_report(report)
        sys.exit(0 if report is not None and report.clean and exited_itself is None else 1)
    finally:
        if timer is not None:
            timer.cancel()
        for s, h in previous.items():
            signal.signal(s, h)


#: What ``--run-name`` accepts: one folder name, no path.
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _named_run_dir(name: str, run_dir: Path | None, err: Console) -> Path:
    """``--run-name NAME``: ``<state dir>/servers/NAME``, which must not hold a launch already."""
    if run_dir is not None:
        err.print("error: --run-name and --run-dir name the same folder; give one", markup=False)
        sys.exit(2)
    if not RUN_NAME.fullmatch(name):
        err.print(f"error: --run-name {name!r}: one folder name of letters, digits, '.', '_' and '-'",
                  markup=False)
        sys.exit(2)
    folder = state_dir() / "servers" / name
    if StateFile(folder).exists():
        err.print(f"error: --run-name {name!r}: {folder} already holds a launch", markup=False)
        sys.exit(2)
    return folder


def _measured(state: RunState) -> tuple[list[ProcessRef], bool]:
    from harvest.net import port_listening

    return procs.alive(state.processes()), port_listening(state.record.host, state.record.port, timeout=0.2)


def _running(entries: list[IndexEntry]) -> list[tuple[IndexEntry, RunState]]:
    out = []
    for e in entries:
        try:
            state = StateFile(e.run_dir).read()
        except StopError:
            continue
        if procs.alive(state.processes()):
            out.append((e, state))
    return out


@click.command("stop")
@click.argument("run_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--deadline", type=click.FloatRange(min=0.1), default=None, metavar="SECONDS",
              help="the whole stop takes at most this long (default: stop_deadline recorded at launch)")
@click.option("--grace", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="seconds between SIGTERM and SIGKILL (default: stop_grace recorded at launch)")
@click.option("--margin-mib", type=click.IntRange(min=0), default=DEFAULT_MARGIN_MIB, show_default=True,
              help="a GPU counts as drained within this many MiB of its pre-launch baseline")
@click.option("--json", "as_json", is_flag=True, help=f"print the stop report as JSON ({STOP_SCHEMA})")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="stop on the [host] of this config (RUN_DIR is then the far run folder)")
@host_options
def stop(run_dir: Path | None, deadline: float | None, grace: float | None, margin_mib: int, as_json: bool,
         config_path: Path | None, far_host: HostConfig | None) -> None:
    """Stop a server harvest started (RUN_DIR, or the only one running) and verify it is gone."""
    from harvest.cli.remote import hosts_of, remote_stop_by_record, remote_stop_run

    err = make_console(stderr=True)
    far = hosts_of(config_path, far_host)
    if far:
        remote_stop_run(far, str(run_dir) if run_dir is not None else None, deadline, as_json)
        return
    if run_dir is not None:
        from harvest.placement.ray.cluster import read_ray_record

        if read_ray_record(run_dir) is not None:  # servers of a Ray run: each stopped on its node
            from harvest.cli.ray_stop import ray_stop

            ray_stop(run_dir, deadline, as_json)
            return
        from harvest.placement.ssh.servers import read_remote_record

        record = read_remote_record(run_dir)
        if record is not None:  # a far server launched from here: its far harvest stops it
            remote_stop_by_record(record, deadline, as_json)
            return
    if run_dir is None:
        running = _running(list_runs())
        if not running:
            err.print("nothing to stop: no server harvest started is running", markup=False)
            sys.exit(2)
        if len(running) > 1:
            err.print("several servers are running; name the run folder:", markup=False)
            for e, st in running:
                err.print(f"  {e.run_dir}  {st.record.engine} pid {st.record.pid} port {st.record.port}",
                          markup=False)
            sys.exit(2)
        run_dir = Path(running[0][0].run_dir)
    if as_json:
        try:
            report = stop_run(run_dir, deadline=deadline, grace=grace, margin_mib=margin_mib)
        except StopError as exc:
            err.print(f"error: {exc}", markup=False)
            sys.exit(2)
        click.echo(json.dumps({"schema": STOP_SCHEMA, **report.to_dict()}, indent=2))
        sys.exit(0 if report.clean else 1)
    out = make_console()
    # Each step is printed as it ends; on a terminal a panel above the prompt shows the one running.
    display = PhaseDisplay(out, f"harvest stop: {run_dir}", phase_lines=False)
    started: list[bool] = []

    def on_step(name: str, step: StopStep | None) -> None:
        if not started:
            started.append(True)
            display.print(f"stop of {run_dir}:", markup=False)
            display.on_event(Event("stopping", "start"))
        display.on_event(Event("stopping", "update", {"step": name, "outcome": step.outcome if step else None}))
        if step is not None:
            display.print(step_line(step), markup=False)

    try:
        with display:
            report = stop_run(run_dir, deadline=deadline, grace=grace, margin_mib=margin_mib, on_step=on_step)
            display.on_event(Event("stopping", "end", {"verdict": report.verdict, "seconds": report.total_s},
                                   ok=report.clean))
    except StopError as exc:
        err.print(f"error: {exc}", markup=False)
        sys.exit(2)
    print_stop_report(report, console=out, steps_shown=bool(started))
    sys.exit(0 if report.clean else 1)


@click.command("ps")
@click.option("--all", "show_all", is_flag=True, help="include servers recorded as stopped")
@click.option("--json", "as_json", is_flag=True, help=f"print JSON ({PS_SCHEMA})")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="list the servers on the [host] / [[hosts]] of this config")
@host_options
def ps(show_all: bool, as_json: bool, config_path: Path | None, far_host: HostConfig | None) -> None:
    """Servers harvest started: what was recorded beside what is measured now."""
    from harvest.cli.remote import hosts_of, remote_ps

    far = hosts_of(config_path, far_host)
    if far:
        remote_ps(far, show_all, as_json)
        return
    rows: list[dict[str, Any]] = []
    for e in list_runs():
        try:
            state = StateFile(e.run_dir).read()
        except StopError:
            continue
        live, listening = _measured(state)
        if not show_all and not live and state.status in (RunStatus.STOPPED, RunStatus.FAILED):
            continue
        rec = state.record
        rows.append({
            "run_dir": e.run_dir, "engine": rec.engine, "url": rec.url, "pid": rec.pid, "port": rec.port,
            "gpus": list(rec.gpus), "started_at": rec.started_at,
            "recorded": {"status": state.status.value, "processes": len(state.processes())},
            "measured": {"leader_alive": any(r.pid == rec.pid for r in live), "alive": len(live),
                         "port_listening": listening},
        })
    if as_json:
        click.echo(json.dumps({"schema": PS_SCHEMA, "servers": rows}, indent=2))
        return
    console = make_console()
    if not rows:
        console.print("no server harvest started is running" + ("" if show_all else " (--all lists stopped ones)"),
                      markup=False)
        return
    console.print(f"{'ENGINE':<12} {'PID':>7} {'PORT':>5}  {'RECORDED':<9} {'ALIVE':<7} {'LISTENING':<9} "
                  f"{'STARTED':<19}  RUN DIR", markup=False)
    for r in rows:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["started_at"]))
        alive = f"{r['measured']['alive']}/{r['recorded']['processes']}"
        console.print(f"{r['engine']:<12} {r['pid']:>7} {r['port']:>5}  {r['recorded']['status']:<9} {alive:<7} "
                      f"{'yes' if r['measured']['port_listening'] else 'no':<9} {started:<19}  {r['run_dir']}",
                      markup=False)
