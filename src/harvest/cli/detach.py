"""``harvest run --detach``: the same run in a session of its own, its output in the run folder.

    harvest run job.toml --detach
    # -> returns once the run passed its start checks (dataset read, preflight, launch, the model
    #    served): "detached, pid N", and the commands to watch and stop it

The command here (the *starter*) holds the run folder, opens its log (``run.log``, appended; the
previous one kept as ``run.log.1`` once it passed :data:`LOG_ROTATE_BYTES`), and starts ``harvest run``
again with the same arguments as a child in a new session (``setsid``: no terminal, so the hangup
of the shell that started it never reaches it; it ignores SIGHUP besides), its stdin empty, its
output to the log, and one end of a pipe. The child (the *runner*) says ``started`` on the pipe once
dispatch began, and closes it; it writes its pid and create time in ``runner.json``
(``campaign/run/runner.py``). Meanwhile the starter shows the log's lines as they come. A runner
that ends before it started (a config mistake, a refused preflight, an engine that does not start)
closes the pipe by exiting: the starter then exits with its exit code (2 for a configuration
error, as without ``--detach``). Every wait is bounded: past the launch's own deadlines the starter
says the run is still starting and returns; Ctrl-C leaves the run alone.

It never signals the runner: ``harvest stop RUN_DIR`` does (``cli/stoprun.py``).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click

from harvest import safefiles
from harvest.campaign.run import runner
from harvest.config import HarvestConfig
from harvest.events import Event
from harvest.redact import escape_controls, redact_text

#: The environment variable that tells ``harvest run --detach`` it is the runner: the pipe's fd.
DETACHED_ENV = "HARVEST_DETACHED_FD"
#: A run log this long is moved to ``run.log.1`` (the one before dropped) when a detached run starts.
LOG_ROTATE_BYTES = 64 << 20
#: Seconds the starter waits beyond the launch's own deadlines, and for the runner's exit after EOF.
START_MARGIN_S = 120.0
EXIT_WAIT_S = 30.0
STARTED = b"started\n"


def child_fd() -> int | None:
    """The pipe's fd when this process is a detached runner (the variable removed: nothing it starts
    inherits it), else None."""
    value = os.environ.pop(DETACHED_ENV, None)
    if value is None or not value.isdigit():
        return None
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # no terminal after setsid; a stray hangup changes nothing
    return int(value)


def started_on(fd: int) -> Callable[[Event], None]:
    """A listener that says ``started`` on ``fd`` (and closes it) when dispatch begins."""
    def on_event(event: Event) -> None:
        nonlocal fd
        if fd >= 0 and event.phase == "generating" and event.kind == "start":
            with contextlib.suppress(OSError):
                os.write(fd, STARTED)
                os.close(fd)
            fd = -1

    return on_event


def _open_log(folder: safefiles.Folder) -> int:
    """``run.log`` in the held run folder, for appending (the one before moved to ``run.log.1``
    once too long); a line marks where this run's output begins."""
    st = folder.lstat(runner.RUN_LOG)
    if st is not None and st.st_size > LOG_ROTATE_BYTES:
        folder.check_file(runner.RUN_LOG)
        folder.unlink(runner.RUN_LOG + ".1")
        folder.move_to(runner.RUN_LOG, folder, runner.RUN_LOG + ".1")
    fd = folder.open(runner.RUN_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.write(fd, f"\n=== harvest run --detach, {time.strftime('%Y-%m-%d %H:%M:%S %z')} ===\n".encode())
    return fd


def start_detached(config: HarvestConfig, args: list[str]) -> int:
    """Start ``harvest ARGS`` detached (see the module docstring); the starter's exit code."""
    run_dir = Path(config.output.dir)
    with safefiles.hold(run_dir, create=True) as folder:
        found = runner.read(folder)
        if found is not None and found.ended_at is None and runner.alive(found):
            click.echo(f"error: the run in {run_dir} is running already (pid {found.pid}); watch it with "
                       f"`harvest status {run_dir} --watch`, stop it with `harvest stop {run_dir}`", err=True)
            return 2
        log_fd = _open_log(folder)
        log_start = os.fstat(log_fd).st_size
        read_fd = folder.open(runner.RUN_LOG, os.O_RDONLY)
    r, w = os.pipe()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "harvest", *args], stdin=subprocess.DEVNULL, stdout=log_fd,
                                stderr=subprocess.STDOUT, start_new_session=True, pass_fds=(w,),
                                env={**os.environ, DETACHED_ENV: str(w)})
    finally:
        os.close(w)
        os.close(log_fd)
    try:
        return _wait_started(proc, r, read_fd, log_start, run_dir, _start_bound(config))
    finally:
        os.close(r)
        os.close(read_fd)


def _start_bound(config: HarvestConfig) -> float:
    server = config.server
    launch = server.ready_timeout if server is not None and server.launched else 0.0
    return launch + config.client.start_deadline + START_MARGIN_S


def _wait_started(proc: subprocess.Popen[bytes], r: int, log_fd: int, offset: int, run_dir: Path,
                  bound: float) -> int:
    """Show the runner's log lines until it says ``started`` (0), its pipe closes with its exit
    (its exit code), the bound passes (0: still starting) or Ctrl-C (130)."""
    click.echo(f"harvest run: detached (pid {proc.pid}); its output: {run_dir / runner.RUN_LOG}", err=True)
    shown = offset
    end = time.monotonic() + bound
    try:
        while time.monotonic() < end:
            ready, _, _ = select.select([r], [], [], 0.2)
            shown = _echo_new(log_fd, shown)
            if not ready:
                continue
            said = os.read(r, 64)
            if said.startswith(STARTED):
                _say_started(proc.pid, run_dir, "started")
                return 0
            if not said:  # EOF: the runner exited before it started
                try:
                    code = proc.wait(timeout=EXIT_WAIT_S)
                except subprocess.TimeoutExpired:
                    click.echo(f"the runner (pid {proc.pid}) closed its pipe without starting and has not exited "
                               f"after {EXIT_WAIT_S:g} s; read {run_dir / runner.RUN_LOG}", err=True)
                    return 1
                _echo_new(log_fd, shown)
                return code
    except KeyboardInterrupt:
        _say_started(proc.pid, run_dir, "still starting; Ctrl-C stopped the waiting, not the run")
        return 130
    _say_started(proc.pid, run_dir, f"still starting after {bound:.0f} s")
    return 0


def _echo_new(fd: int, offset: int) -> int:
    """The log's lines written since ``offset`` to stderr (redacted, controls escaped); the new offset."""
    data = os.pread(fd, 1 << 20, offset)
    if not data:
        return offset
    cut = data.rfind(b"\n") + 1  # whole lines only; the rest waits for its end
    for line in data[:cut].decode("utf-8", "replace").splitlines():
        click.echo(escape_controls(redact_text(line)), err=True)
    return offset + cut


def _say_started(pid: int, run_dir: Path, how: str) -> None:
    click.echo(f"harvest run: {how}; runs on detached, pid {pid}\n"
               f"  run folder: {run_dir}\n"
               f"  watch it:   harvest status {run_dir} --watch\n"
               f"  stop it:    harvest stop {run_dir}")


__all__ = ["DETACHED_ENV", "LOG_ROTATE_BYTES", "child_fd", "start_detached", "started_on"]
