"""``harvest serve``, ``harvest stop`` and ``harvest ps``: supervised launch, verified stop, listing.

    harvest serve CONFIG [--run-dir D | --run-name N] [--detach [--json]] [--force] [--give-up-after S]
                                                                         (CONFIG "-": read from stdin)
    harvest stop [RUN_DIR] [--deadline S] [--json] [--config F | --host USER@NAME ...]
    harvest ps [--all] [--json] [--config F | --host USER@NAME ...]

Where the servers run is the placement's (:mod:`harvest.placement`): chosen once from CONFIG (its
``[host]`` / ``[[hosts]]``, its ``[cluster]``; ``--config F`` / ``--host`` for stop and ps), or from a
RUN_DIR's record for ``stop`` (a run folder of any placement: its own, ``server/`` or ``host-*/``).
A command that cannot work there is refused with one line (exit 2), never run here instead.

Exit codes: serve 0 after a clean stop (or once detached), 1 when refused by preflight, when the
engine failed to start or exited on its own, or when the stop was dirty, 130 when interrupted
during start-up; stop 0 clean or nothing to stop (said so), 1 dirty, 2 no such folder or a record that
cannot be read or is refused. This module parses
options and renders; launching and stopping live in :mod:`harvest.server`, and nothing here
signals a process itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import click
import psutil
from rich.console import Console

from harvest import safefiles, schemas
from harvest.cli.live import PhaseDisplay, setup_console_logging
from harvest.cli.options import host_options, load_config_arg
from harvest.cli.render import (
    make_console,
    preflight_refusal,
    print_ps,
    print_stop_report,
    print_stop_reports,
    ps_payload,
    rule_line,
    shown,
    step_line,
    stop_payload,
)
from harvest.config import HostConfig, load_config
from harvest.errors import LaunchError, PreflightFailed
from harvest.events import Event
from harvest.placement import Flags, NothingToStop, from_config, from_record
from harvest.server.state import ProcessRef, RunStatus, StateFile, default_run_dir, state_dir
from harvest.server.stop import DEFAULT_MARGIN_MIB, StopStep

SERVE_SCHEMA = schemas.SERVE
STOP_SCHEMA = schemas.STOP
PS_SCHEMA = schemas.PS


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
    """Launch the [server] of CONFIG supervised where the config places it (this machine, its [host],
    its [cluster]); Ctrl-C (or SIGTERM) stops it with verification."""
    cfg = load_config_arg(config)
    server_cfg = cfg.require_server()
    err = make_console(stderr=True)
    if as_json and not detach:
        _usage(err, "--json needs --detach")
    if not server_cfg.launched:
        _usage(err, f"engine '{server_cfg.engine}' is a running endpoint; harvest does not launch it")
    placement = from_config(cfg)
    if placement.kind != "local":
        if run_name is not None or give_up_after is not None:
            _usage(err, f"--run-name and --give-up-after are what harvest passes to a far serve; on "
                        f"{placement.where()} it chooses both itself")
        _serve_placed(placement, cfg, run_dir, detach, force, as_json, err)
        return
    setup_console_logging(err)  # log records print above the live panel, never into it
    if run_name is not None:
        run_dir = _named_run_dir(run_name, run_dir, err)
    run_dir = run_dir if run_dir is not None else default_run_dir(server_cfg.engine, server_cfg.port)
    display = PhaseDisplay(err, f"harvest serve: {server_cfg.engine} on {server_cfg.url}")
    server = placement.server(server_cfg, run_dir=run_dir, preflight=cfg.preflight, force=force,
                              on_preflight=_show_forced_preflight(err, force), on_event=display.on_event)
    stop_requested = threading.Event()
    gave_up = threading.Event()
    with _signals(stop_requested, server), _give_up_timer(give_up_after, gave_up, server) as timer:
        err.print(f"launching {server_cfg.engine} on {server_cfg.url} (run dir {run_dir})", markup=False)
        _launch_here(server, display, err, stop_requested, gave_up, give_up_after)
        timer.cancel()
        _print_ready(server, run_dir, as_json)
        if detach:
            _detach_here(server, server_cfg, run_dir, as_json)
            return
        exited_itself = _wait_here(server, stop_requested, err)
        report = _stop_here(server, server_cfg, err)
    sys.exit(0 if report is not None and report.clean and exited_itself is None else 1)


def _usage(err: Console, message: str) -> NoReturn:
    err.print(f"error: {message}", markup=False)
    sys.exit(2)


def _show_forced_preflight(err: Console, force: bool) -> Any:
    def show(report: Any) -> None:
        if not report.passed and force:
            err.print("preflight FAILED, launching anyway (--force):", markup=False)
            for r in report.failures:
                err.print(rule_line(r))

    return show


@contextlib.contextmanager
def _signals(stop_requested: threading.Event, server: Any) -> Iterator[None]:
    """SIGINT / SIGTERM ask for the stop (a launch in progress gives up); restored afterwards."""

    def on_signal(signum: int, frame: object) -> None:
        stop_requested.set()
        server.cancel()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def _give_up_timer(give_up_after: float | None, gave_up: threading.Event, server: Any) -> Iterator[Any]:
    """``--give-up-after``: the launch (preflight included) is cancelled past this point."""

    def give_up() -> None:
        gave_up.set()
        server.cancel()

    timer = threading.Timer(give_up_after if give_up_after is not None else 0.0, give_up)
    timer.daemon = True
    if give_up_after is not None:
        timer.start()
    try:
        yield timer
    finally:
        timer.cancel()


def _launch_here(server: Any, display: PhaseDisplay, err: Console, stop_requested: threading.Event,
                 gave_up: threading.Event, give_up_after: float | None) -> None:
    """The launch with its phases live; a refusal or failure ends the command (1, or 130 when interrupted)."""
    try:
        with display:  # the launch phases, live; a failed start-up's stop shows there too
            server.launch()
    except PreflightFailed as exc:
        _refused_by_preflight(err, exc, "")
    except LaunchError as exc:
        if gave_up.is_set() and not stop_requested.is_set():
            err.print(f"launch failed: not ready within --give-up-after {give_up_after:g} s; gave up "
                      f"({str(exc).splitlines()[0]})", markup=False)
        else:
            err.print(f"launch failed: {exc}", markup=False)
        if server.stop_report is not None:
            print_stop_report(server.stop_report, err=True)
        sys.exit(130 if exc.reason == "cancelled" and not gave_up.is_set() else 1)


def _refused_by_preflight(err: Console, exc: PreflightFailed, where: str) -> NoReturn:
    failures = [r for r in exc.results if not getattr(r, "passed", True)]
    for r in failures:
        err.print(rule_line(r))  # type: ignore[arg-type]
    err.print(preflight_refusal(failures, where), markup=False)
    sys.exit(1)


def _print_ready(server: Any, run_dir: Path, as_json: bool) -> None:
    ready = server.ready
    kv = server.kv_capacity_tokens
    click.echo(f"ready: {server.url} pid {server.pid} in {ready.seconds if ready else 0:.1f} s"
               + (f", KV capacity {kv} tokens" if kv is not None else "") + f"; run dir {run_dir}", err=as_json)


def _serve_doc(fleet: Any, server_cfg: Any, run_dir: Path) -> dict[str, Any]:
    """The ``harvest serve --detach --json`` document (``harvest.serve/2``) of a launch anywhere."""
    ready = fleet.ready
    placed = fleet.placed()
    return {"schema": SERVE_SCHEMA, "run_dir": str(Path(run_dir).resolve()), "engine": server_cfg.engine,
            "url": fleet.url, "host": fleet.client_config.host, "port": fleet.client_config.port,
            "pid": placed[0]["pid"] if placed else None, "ready_s": ready.seconds if ready else 0.0,
            "kv_capacity_tokens": fleet.kv_capacity_tokens, "servers": placed}


def _detach_here(server: Any, server_cfg: Any, run_dir: Path, as_json: bool) -> None:
    server.record_watcher(_spawn_watcher(Path(run_dir)))
    server.detach()
    if as_json:
        click.echo(json.dumps(_serve_doc(server, server_cfg, run_dir)))
    else:
        click.echo(f"detached; stop it with: harvest stop {run_dir}")


def _wait_here(server: Any, stop_requested: threading.Event, err: Console) -> int | None:
    """Until Ctrl-C, or the engine's own exit (its code returned), or a stop from another process."""
    while not stop_requested.wait(0.5):
        code = server.returncode()
        if code is None:
            continue
        if server.state().status in (RunStatus.STOPPING, RunStatus.STOPPED, RunStatus.DIRTY):
            err.print("stopped by `harvest stop` from another process; verifying cleanup", markup=False)
            return None
        err.print(f"the engine exited on its own with code {code}; verifying cleanup", markup=False)
        return code
    return None


def _stop_here(server: Any, server_cfg: Any, err: Console) -> Any:
    stopping = PhaseDisplay(err, f"harvest serve: stopping {server_cfg.engine} pid {server.pid}")
    server.listen(stopping.on_event)
    with stopping:  # the stop's steps, live
        report = server.shutdown()
    if report is not None:
        print_stop_report(report)
    return report


def _serve_placed(placement: Any, cfg: Any, run_dir: Path | None, detach: bool, force: bool, as_json: bool,
                  err: Console) -> None:
    """``harvest serve`` where the config places it off this machine (its [host], its [cluster]): the
    fleet's launch, then detached (the near record says where) or watched until Ctrl-C, then every
    server's verified stop there."""
    server_cfg = cfg.require_server()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    near = run_dir if run_dir is not None else \
        state_dir() / "placed" / f"{stamp}-{server_cfg.engine}-{server_cfg.port}-{os.getpid()}"
    display = PhaseDisplay(err, f"harvest serve: {server_cfg.engine} on {placement.where()}")
    fleet = placement.server(server_cfg, run_dir=near, preflight=cfg.preflight, force=force,
                             on_event=display.on_event)
    stop_requested = threading.Event()
    err.print(f"launching {server_cfg.engine} on {placement.where()} (near record {near})", markup=False)

    async def run() -> list[Any] | None:
        try:
            with display:
                await fleet.start()
        except PreflightFailed as exc:
            _refused_by_preflight(err, exc, f" on {placement.where()}")
        except LaunchError as exc:
            err.print(f"launch failed: {exc}", markup=False)
            for r in fleet.stop_reports:
                print_stop_report(r, err=True)
            sys.exit(1)
        where = ", ".join(f"{p['where']} pid {p['pid']}" for p in fleet.placed())
        click.echo(f"ready: {' '.join(fleet.urls)} on {where}; near record {near}", err=as_json)
        if detach:
            fleet.detach()
            if as_json:
                click.echo(json.dumps(_serve_doc(fleet, server_cfg, near)))
            else:
                click.echo(f"detached; stop it with: harvest stop {near}")
            return None
        while not stop_requested.is_set():
            if fleet.returncode() is not None:
                err.print("the far server or its tunnel is gone; stopping", markup=False)
                break
            await asyncio.sleep(0.5)
        return await fleet.stop()

    with _signals(stop_requested, fleet):
        reports = asyncio.run(run())
    if reports is None:
        return
    print_stop_reports(reports, placement.where())
    sys.exit(0 if reports and all(r.clean for r in reports) else 1)


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
    """Stop servers harvest started (RUN_DIR, or the only one running) and verify they are gone.

    RUN_DIR's record says where its servers run (this machine, a far host, a Ray cluster); with
    --config F or --host the far harvest of that host stops its RUN_DIR (a far folder). Nothing to
    stop (a folder without a launch record, or no RUN_DIR and nothing running) is said and exits 0."""
    try:
        _stop(run_dir, deadline, grace, margin_mib, as_json, config_path, far_host)
    except NothingToStop as exc:
        if as_json:
            click.echo(json.dumps(stop_payload([]), indent=2))
        click.echo(shown(exc.problems[0][1]), err=as_json)  # "nothing to stop: ...", one line
        sys.exit(0)


def _stop(run_dir: Path | None, deadline: float | None, grace: float | None, margin_mib: int, as_json: bool,
          config_path: Path | None, far_host: HostConfig | None) -> None:
    err = make_console(stderr=True)
    if config_path is not None or far_host is not None:
        placement = from_config(load_config(config_path) if config_path is not None else None,
                                Flags(host=far_host))
        if placement.kind == "ray":  # a Ray job's servers: by the run folder's record
            if run_dir is None:
                _usage(err, f"--config {config_path}: name the run folder of the servers on {placement.where()}")
            placement = from_record(run_dir)
    elif run_dir is not None:
        placement = from_record(run_dir)
    else:
        placement = from_config(None)
    if as_json or placement.kind != "local":
        reports = placement.stop(run_dir, deadline=deadline, grace=grace, margin_mib=margin_mib)
        if as_json:
            click.echo(json.dumps(stop_payload(reports), indent=2))
        else:
            print_stop_reports(reports, placement.where())
        # A run folder whose servers were all stopped already: nothing left, clean (as a local record).
        sys.exit(0 if all(r.clean for r in reports) else 1)
    _stop_here_live(placement, run_dir, deadline, grace, margin_mib)


def _stop_here_live(placement: Any, run_dir: Path | None, deadline: float | None, grace: float | None,
                    margin_mib: int) -> NoReturn:
    """A stop on this machine, each step printed as it ends (a panel above the prompt on a terminal)."""
    out = make_console()
    shown = str(run_dir) if run_dir is not None else "the server running"
    display = PhaseDisplay(out, f"harvest stop: {shown}", phase_lines=False)
    started: list[bool] = []

    def on_step(name: str, step: StopStep | None) -> None:
        if not started:
            started.append(True)
            display.print(f"stop of {shown}:", markup=False)
            display.on_event(Event("stopping", "start"))
        display.on_event(Event("stopping", "update", {"step": name, "outcome": step.outcome if step else None}))
        if step is not None:
            display.print(step_line(step), markup=False)

    with display:
        report = placement.stop(run_dir, deadline=deadline, grace=grace, margin_mib=margin_mib, on_step=on_step)[0]
        display.on_event(Event("stopping", "end", {"verdict": report.verdict, "seconds": report.total_s},
                               ok=report.clean))
    print_stop_report(report, console=out, steps_shown=bool(started))
    sys.exit(0 if report.clean else 1)


@click.command("ps")
@click.option("--all", "show_all", is_flag=True, help="include servers recorded as stopped")
@click.option("--json", "as_json", is_flag=True, help=f"print JSON ({PS_SCHEMA})")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="list the servers where this config places them ([host] / [[hosts]], [cluster])")
@host_options
def ps(show_all: bool, as_json: bool, config_path: Path | None, far_host: HostConfig | None) -> None:
    """Servers harvest started: what was recorded beside what is measured now."""
    placement = from_config(load_config(config_path) if config_path is not None else None, Flags(host=far_host))
    rows = placement.ps(show_all)
    if as_json:
        click.echo(json.dumps(ps_payload(rows), indent=2))
        return
    print_ps(make_console(), rows, placement.where(), show_all)
