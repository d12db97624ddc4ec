"""``harvest serve``, ``harvest stop`` and ``harvest ps``: supervised launch, verified stop, listing.

    harvest serve CONFIG [--run-dir D | --run-name N] [--detach [--json]] [--force] [--give-up-after S]
                                                                         (CONFIG "-": read from stdin)
    harvest stop [RUN_DIR] [--deadline S] [--json] [--config F | --host USER@NAME ...]
                                        (a run folder whose run goes on: the run stopped, cli/stoprun.py)
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
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console

from harvest import schemas
from harvest.checks import PreflightReport
from harvest.cli.live import PhaseDisplay, setup_console_logging
from harvest.cli.options import host_options, job_flags, load_config_arg
from harvest.cli.render import (
    make_console,
    print_ps,
    print_refusal,
    print_stop_report,
    print_stop_reports,
    ps_payload,
    rule_line,
    shown,
    step_line,
    stop_payload,
)
from harvest.config import HostConfig, Override, ServerConfig, load_config
from harvest.errors import LaunchError, PreflightFailed
from harvest.events import Event
from harvest.placement import Flags, Fleet, NothingToStop, OnPreflight, Placement, Refused, from_config, from_record
from harvest.server import StateFile, default_run_dir, state_dir
from harvest.stops import DEFAULT_MARGIN_MIB, StopReport, StopStep

SERVE_SCHEMA = schemas.SERVE
STOP_SCHEMA = schemas.STOP
PS_SCHEMA = schemas.PS


@click.command("serve")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path), required=False)
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
@job_flags()
def serve(config: Path | None, run_dir: Path | None, detach: bool, force: bool, as_json: bool, run_name: str | None,
          give_up_after: float | None, overrides: tuple[Override, ...]) -> None:
    """Launch the [server] of CONFIG supervised where the config places it (this machine, its [host],
    its [cluster]); Ctrl-C (or SIGTERM) stops it with verification."""
    if config is None and not overrides:
        raise click.UsageError("give a job file (CONFIG) or the server as flags: --engine, --model")
    cfg = load_config_arg(config, overrides)
    server_cfg = cfg.require_server()
    err = make_console(stderr=True)
    if as_json and not detach:
        _usage(err, "--json needs --detach")
    if not server_cfg.launched:
        _usage(err, f"engine '{server_cfg.engine}' is a running endpoint; harvest does not launch it")
    if run_name is not None:
        _check_run_name(run_name, run_dir, err)
    placement = from_config(cfg)
    run_dir = serve_dir(placement, server_cfg, run_dir, run_name=run_name, give_up_after=give_up_after)
    words = serve_words(placement, server_cfg)
    setup_console_logging(err)  # log records print above the live panel, never into it
    display = PhaseDisplay(err, f"harvest serve: {server_cfg.engine} on {words.target}")
    fleet = placement.server(server_cfg, run_dir=run_dir, preflight=cfg.preflight, force=force,
                             on_preflight=_show_forced_preflight(err, force), on_event=display.on_event)
    served = _Served(fleet, server_cfg, run_dir, words, err, display, placement.where())
    with _signals(served.stop_requested, fleet), _give_up_timer(give_up_after, served.gave_up, fleet) as timer:
        err.print(f"launching {server_cfg.engine} on {words.target} ({words.folder} {run_dir})", markup=False)
        sys.exit(asyncio.run(served.run(timer, detach, as_json, give_up_after)))


@dataclass(frozen=True)
class ServeWords:
    """How ``harvest serve`` names a launch of a placement in its lines."""

    #: What it launches on: the server's URL on this machine, the host(s) or the cluster elsewhere.
    target: str
    #: What the launch's folder is: the ``run dir`` here, the ``near record`` of far servers.
    folder: str
    #: Appended to "refused to launch" (nothing here, `` on HOST`` elsewhere).
    refused_on: str
    #: Said when the servers exit or go away by themselves (``{code}``: their return code).
    gone: str


def serve_words(placement: Placement, server: ServerConfig) -> ServeWords:
    """The words of a launch on ``placement``: supervised here, or by a far harvest / a node's actor."""
    if placement.here:
        return ServeWords(server.url, "run dir", "", "the engine exited on its own with code {code}; verifying cleanup")
    where = placement.where()
    return ServeWords(where, "near record", f" on {where}", "the far server or its tunnel is gone; stopping")


def serve_dir(placement: Placement, server: ServerConfig, run_dir: Path | None, *, run_name: str | None = None,
              give_up_after: float | None = None) -> Path:
    """The folder of a launch: ``run_dir``, else a new one under the state dir. Here, ``--run-name
    NAME`` is ``<state dir>/servers/NAME``, which must not hold a launch already; ``--run-name`` and
    ``--give-up-after`` are what a near harvest passes to a far serve, so elsewhere they are refused
    (the placement chooses both itself)."""
    if not placement.here:
        if run_name is not None or give_up_after is not None:
            raise Refused("--run-name and --give-up-after are what harvest passes to a far serve",
                          f"on {placement.where()} it chooses both itself")
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return run_dir if run_dir is not None else \
            state_dir() / "placed" / f"{stamp}-{server.engine}-{server.port}-{os.getpid()}"
    if run_name is None:
        return run_dir if run_dir is not None else default_run_dir(server.engine, server.port)
    folder = state_dir() / "servers" / run_name
    if StateFile(folder).exists():
        raise Refused(f"--run-name {run_name!r}", f"{folder} already holds a launch")
    return folder


def _usage(err: Console, message: str) -> NoReturn:
    err.print(f"error: {message}", markup=False)
    sys.exit(2)


#: What ``--run-name`` accepts: one folder name, no path.
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _check_run_name(name: str, run_dir: Path | None, err: Console) -> None:
    """``--run-name NAME``: one folder name, never beside ``--run-dir``."""
    if run_dir is not None:
        _usage(err, "--run-name and --run-dir name the same folder; give one")
    if not RUN_NAME.fullmatch(name):
        _usage(err, f"--run-name {name!r}: one folder name of letters, digits, '.', '_' and '-'")


def _show_forced_preflight(err: Console, force: bool) -> OnPreflight:
    def show(report: PreflightReport) -> None:
        if not report.passed and force:
            err.print("preflight FAILED, launching anyway (--force):", markup=False)
            for r in report.failures:
                err.print(rule_line(r))

    return show


@contextlib.contextmanager
def _signals(stop_requested: threading.Event, fleet: Fleet) -> Iterator[None]:
    """SIGINT / SIGTERM ask for the stop (a launch in progress gives up); restored afterwards."""

    def on_signal(signum: int, frame: object) -> None:
        stop_requested.set()
        fleet.cancel()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def _give_up_timer(give_up_after: float | None, gave_up: threading.Event, fleet: Fleet) -> Iterator[threading.Timer]:
    """``--give-up-after``: the launch (preflight included) is cancelled past this point."""

    def give_up() -> None:
        gave_up.set()
        fleet.cancel()

    timer = threading.Timer(give_up_after if give_up_after is not None else 0.0, give_up)
    timer.daemon = True
    if give_up_after is not None:
        timer.start()
    try:
        yield timer
    finally:
        timer.cancel()


class _Served:
    """One ``harvest serve``: launch, ready, then detached or watched until Ctrl-C, then every
    server's verified stop where it runs. Its ``run`` returns the exit code."""

    def __init__(self, fleet: Fleet, server_cfg: ServerConfig, run_dir: Path, words: ServeWords, err: Console,
                 display: PhaseDisplay, where: str):
        self.fleet, self.server_cfg, self.run_dir, self.words = fleet, server_cfg, run_dir, words
        self.err, self.display, self.where = err, display, where
        self.stop_requested = threading.Event()
        self.gave_up = threading.Event()

    async def run(self, timer: threading.Timer, detach: bool, as_json: bool, give_up_after: float | None) -> int:
        await self.launch(give_up_after)
        timer.cancel()
        self.print_ready(as_json)
        if detach:
            self.fleet.detach()
            if as_json:
                click.echo(json.dumps(_serve_doc(self.fleet, self.server_cfg, self.run_dir)))
            else:
                click.echo(f"detached; stop it with: harvest stop {self.run_dir}")
            return 0
        exited_itself = await self.wait()
        reports = await self.stop()
        return 0 if reports and all(r.clean for r in reports) and exited_itself is None else 1

    async def launch(self, give_up_after: float | None) -> None:
        """The launch with its phases live; a refusal or failure ends the command (1, or 130 when interrupted)."""
        try:
            with self.display:  # the launch phases, live; a failed start-up's stop shows there too
                await self.fleet.start()
        except PreflightFailed as exc:
            print_refusal(self.err, exc, self.words.refused_on)
            sys.exit(1)
        except LaunchError as exc:
            if self.gave_up.is_set() and not self.stop_requested.is_set():
                self.err.print(f"launch failed: not ready within --give-up-after {give_up_after:g} s; gave up "
                               f"({str(exc).splitlines()[0]})", markup=False)
            else:
                self.err.print(f"launch failed: {exc}", markup=False)
            for report in self.fleet.stop_reports:
                print_stop_report(report, err=True)
            sys.exit(130 if exc.reason == "cancelled" and not self.gave_up.is_set() else 1)

    def print_ready(self, as_json: bool) -> None:
        fleet = self.fleet
        ready, kv = fleet.ready, fleet.kv_capacity_tokens
        where = ", ".join(f"{p['where']} pid {p['pid']}" for p in fleet.placed())
        click.echo(f"ready: {' '.join(fleet.urls)} on {where} in {ready.seconds if ready else 0:.1f} s"
                   + (f", KV capacity {kv} tokens" if kv is not None else "")
                   + f"; {self.words.folder} {self.run_dir}", err=as_json)

    async def wait(self) -> int | None:
        """Until Ctrl-C, or the servers' own exit (their code returned), or a stop from another process."""
        while not self.stop_requested.is_set():
            await asyncio.sleep(0.5)
            code = self.fleet.returncode()
            if code is None:
                continue
            if self.fleet.stopped_elsewhere():
                self.err.print("stopped by `harvest stop` from another process; verifying cleanup", markup=False)
                return None
            self.err.print(self.words.gone.format(code=code), markup=False)
            return code
        return None

    async def stop(self) -> list[StopReport]:
        """Every server's verified stop, its steps live, then each report."""
        pids = ", ".join(f"pid {p['pid']}" for p in self.fleet.placed())
        stopping = PhaseDisplay(self.err, f"harvest serve: stopping {self.server_cfg.engine} {pids}")
        self.fleet.listen(stopping.on_event)
        with stopping:  # the stop's steps, live
            reports = await self.fleet.stop()
        print_stop_reports(reports, self.where)
        return reports


def _serve_doc(fleet: Fleet, server_cfg: ServerConfig, run_dir: Path) -> dict[str, Any]:
    """The ``harvest serve --detach --json`` document (``harvest.serve/2``) of a launch anywhere."""
    ready = fleet.ready
    placed = fleet.placed()
    return {"schema": SERVE_SCHEMA, "run_dir": str(Path(run_dir).resolve()), "engine": server_cfg.engine,
            "url": fleet.url, "host": fleet.client_config.host, "port": fleet.client_config.port,
            "pid": placed[0]["pid"] if placed else None, "ready_s": ready.seconds if ready else 0.0,
            "kv_capacity_tokens": fleet.kv_capacity_tokens, "servers": placed}


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
    stop (a folder without a launch record, or no RUN_DIR and nothing running) is said and exits 0.
    A run folder whose `harvest run` goes on (detached or not) is stopped as Ctrl-C stops it: its
    items back to pending, its servers' verified stop; the same `harvest run` resumes it."""
    if run_dir is not None and config_path is None and far_host is None:
        from harvest.cli.stoprun import live_runner, stop_run

        record = live_runner(run_dir)
        if record is not None:
            sys.exit(stop_run(run_dir, record, deadline, as_json))
    try:
        _stop(run_dir, deadline, grace, margin_mib, as_json, config_path, far_host)
    except NothingToStop as exc:
        if as_json:
            click.echo(json.dumps(stop_payload([]), indent=2))
        click.echo(shown(exc.problems[0][1]), err=as_json)  # "nothing to stop: ...", one line
        sys.exit(0)


def _stop(run_dir: Path | None, deadline: float | None, grace: float | None, margin_mib: int, as_json: bool,
          config_path: Path | None, far_host: HostConfig | None) -> None:
    if config_path is not None or far_host is not None:
        placement = from_config(load_config(config_path) if config_path is not None else None,
                                Flags(host=far_host))
    elif run_dir is not None:
        placement = from_record(run_dir)
    else:
        placement = from_config(None)
    if as_json:
        reports = placement.stop(run_dir, deadline=deadline, grace=grace, margin_mib=margin_mib)
        click.echo(json.dumps(stop_payload(reports), indent=2))
    else:
        reports = _stop_live(placement, run_dir, deadline, grace, margin_mib)
    # A run folder whose servers were all stopped already: nothing left, clean (as a local record).
    sys.exit(0 if all(r.clean for r in reports) else 1)


def _stop_live(placement: Placement, run_dir: Path | None, deadline: float | None, grace: float | None,
               margin_mib: int) -> list[StopReport]:
    """A stop, each step printed as it ends where the stop runs here (a panel above the prompt on a
    terminal, from the first step on), then every server's report."""
    out = make_console()
    shown = str(run_dir) if run_dir is not None else "the server running"
    display = PhaseDisplay(out, f"harvest stop: {shown}", phase_lines=False)
    started: list[bool] = []

    def on_step(name: str, step: StopStep | None) -> None:
        if not started:
            started.append(True)
            display.__enter__()
            display.print(f"stop of {shown}:", markup=False)
            display.on_event(Event("stopping", "start"))
        display.on_event(Event("stopping", "update", {"step": name, "outcome": step.outcome if step else None}))
        if step is not None:
            display.print(step_line(step), markup=False)

    try:
        reports = placement.stop(run_dir, deadline=deadline, grace=grace, margin_mib=margin_mib, on_step=on_step)
        if started:
            clean = all(r.clean for r in reports)
            display.on_event(Event("stopping", "end", {"verdict": "clean" if clean else "dirty",
                                                       "seconds": max((r.total_s for r in reports), default=0.0)},
                                   ok=clean))
    finally:
        display.close()
    print_stop_reports(reports, placement.where(), console=out, steps_shown=bool(started))
    return reports


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
