"""The supervisor: launch an engine server so that it can always be stopped completely.

    async with Server(config, run_dir=run_dir) as server:     # preflight, spawn, readiness
        ... talk to server.url ...
    # here: verified stop (see harvest.server.stop), idempotent

Order of a launch: a public address without its API key refused -> preflight (refused on failure
unless ``force``) -> GPU baseline measured -> spawn with ``start_new_session=True``, output to
``RUN_DIR/server.log`` (the last launch's log, record and stop report first moved to
``RUN_DIR/launches/N/``: :mod:`harvest.server.history`) -> launch record written (0600) -> a background thread records descendants
every ~2 s -> readiness with a deadline, failing fast on exit or a fatal log line. A failed start-up
is followed by the same verified stop, so nothing is left behind. The sync methods (``launch``,
``shutdown``) serve the CLI; the async ones wrap them.

It never signals anything itself: stopping is :func:`harvest.server.stop.stop_run`, which acts only
on what the launch record lists.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import TracebackType

import psutil

from harvest import safefiles
from harvest.checks import PreflightReport
from harvest.config import PreflightConfig, ServerConfig, is_loopback
from harvest.engine_pins import version_warning
from harvest.errors import ConfigError, LaunchError, PreflightFailed, StopError, UnsafePathError
from harvest.events import Listener, emit
from harvest.http import HttpError, SyncHttp
from harvest.gpu.records import GpuProbe
from harvest.redact import secret_env_values
from harvest.server import procs
from harvest.server.base import (
    ENGINE_SOURCES,
    EngineAdapter,
    adapter_for,
    engine_paths,
    missing_executable,
    private_files,
)
from harvest.server.history import keep_last_launch
from harvest.server.milestones import LaunchReporter
from harvest.server.readiness import LogWatcher, Ready, wait_ready
from harvest.server.state import (
    LOG_FILE,
    LaunchRecord,
    ProcessRef,
    RunState,
    RunStatus,
    StateFile,
    check_run_files,
    default_run_dir,
    hold_index,
    make_run_dir,
    redact_argv,
    register_run,
)
from harvest.server.stop import DEFAULT_MARGIN_MIB, StopReport, StopStep, stop_run

log = logging.getLogger("harvest.server")

#: Seconds between two recordings of the server's descendants.
RECORD_INTERVAL = 2.0
#: How long a launch into a stopped server's folder waits for that server's watcher to exit (it checks
#: every 2 s, see server/watch.py).
WATCHER_EXIT_S = 6.0
#: Longest a shutdown waits for a concurrent launch to finish writing its record.
SPAWN_LOCK_TIMEOUT = 30.0


class DescendantRecorder:
    """A daemon thread that adds the server's descendants to the state file every ``interval`` s."""

    def __init__(self, state_file: StateFile, interval: float = RECORD_INTERVAL):
        self.state_file = state_file
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="harvest-recorder", daemon=True)
        #: The last error (the thread keeps going; a stop rediscovers anyway).
        self.error: Exception | None = None

    def start(self) -> None:
        self._thread.start()

    def record_once(self) -> int:
        """Record descendants now; returns how many new ones were added."""
        state = self.state_file.read()
        found = procs.discover(state)
        after = self.state_file.add_descendants(found, keep=_still_there)
        known = {(d.pid, d.create_time) for d in state.descendants}
        return sum(1 for d in after.descendants if (d.pid, d.create_time) not in known)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.record_once()
            except (OSError, StopError, UnsafePathError) as exc:
                self.error = exc

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)


def _refuse_live_record(folder: safefiles.Folder) -> None:
    """A folder holding the record of a server still running is that server's: a second launch
    there would overwrite its record and log, and ``ps``/``stop`` would lose it."""
    run_dir = folder.path
    state_file = StateFile(folder)
    if not state_file.exists():
        return
    try:
        state = state_file.read()
    except StopError:
        return  # unreadable: refused just after, with every file the launch writes (check_run_files)
    live = procs.alive(state.processes())
    if not live and state.watcher is not None:
        # The server is gone; its watcher notices within one interval (2 s) and exits by itself.
        # Give it that much, bounded, so that it cannot write into the new launch's record.
        deadline = time.monotonic() + WATCHER_EXIT_S
        while procs.alive([state.watcher]) and time.monotonic() < deadline:
            time.sleep(0.1)
        live = procs.alive([state.watcher])
    if live:
        raise UnsafePathError(state_file.path, f"is the record of a live server ({state.record.engine}, pid "
                                               f"{', '.join(str(r.pid) for r in live)}); stop it with "
                                               f"`harvest stop {run_dir}` or launch into another folder")


def check_run_dir(run_dir: Path | str | safefiles.Folder, config: ServerConfig) -> None:
    """Refuse (:class:`UnsafePathError`) a run folder a launch of ``config`` would be refused in
    after its spawn: the folder itself (another user's, writable by others, in parents others can
    rename it out of), or a file the launch writes there (the record, its lock, the log, the stop
    report, the watcher's log, the engine's private files) that harvest refuses to write. An absent
    folder passes (it is created 0700). For callers that check before anything starts; the launch
    checks the same again on the folder it holds, before the spawn."""
    if isinstance(run_dir, safefiles.Folder):
        check_run_files(run_dir, private_files(adapter_for(config.engine), config))
        return
    if not os.path.lexists(run_dir):
        return
    with make_run_dir(run_dir) as folder:
        check_run_files(folder, private_files(adapter_for(config.engine), config))


def _still_there(ref: ProcessRef) -> bool:
    return procs.verified(ref, include_zombies=True) is not None


class Server:
    """One engine server harvest launches (or, for ``engine = "openai"``, an endpoint it only checks).

    Lifecycle: construct -> :meth:`launch` / ``await start()`` -> use :attr:`url` ->
    :meth:`shutdown` / ``await stop()`` (idempotent; returns the same StopReport every time).
    :meth:`detach` hands the running server over to the state file instead of stopping it.
    """

    def __init__(
        self,
        config: ServerConfig,
        *,
        run_dir: Path | str | safefiles.Folder | None = None,
        preflight: PreflightConfig | None = None,
        force: bool = False,
        probe: GpuProbe | None = None,
        record_interval: float = RECORD_INTERVAL,
        stop_margin_mib: int = DEFAULT_MARGIN_MIB,
        on_preflight: Callable[[PreflightReport], None] | None = None,
        on_event: Listener | None = None,
    ):
        self.config = config
        self.adapter: EngineAdapter = adapter_for(config.engine)
        #: The run folder as the caller holds it (a campaign's ``server/``), else held at the launch.
        self._given = run_dir if isinstance(run_dir, safefiles.Folder) else None
        if isinstance(run_dir, safefiles.Folder):
            self.run_dir = run_dir.path
        else:
            self.run_dir = Path(run_dir) if run_dir is not None else default_run_dir(config.engine, config.port)
        self.preflight_config = preflight or PreflightConfig()
        self.force = force
        self.record_interval = record_interval
        self.stop_margin_mib = stop_margin_mib
        self.on_preflight = on_preflight
        #: Hears the phases (preflight, launching, stopping) as they go; see harvest.events.
        self.on_event = on_event
        self.state_file = StateFile(self._given or self.run_dir)
        #: The preflight report of the launch (None before it ran, and for endpoints).
        self.preflight_report: PreflightReport | None = None
        self.ready: Ready | None = None
        self.kv_capacity_tokens: int | None = None
        #: The report of the stop, once one ran (also after a failed start-up).
        self.stop_report: StopReport | None = None
        self._probe = probe
        self._own_probe = probe is None
        self._popen: subprocess.Popen[bytes] | None = None
        self._recorder: DescendantRecorder | None = None
        self._cancel = threading.Event()
        self._spawn_lock = threading.Lock()
        self._stop_lock = threading.Lock()
        self._launched = False
        self._finished = False
        #: Owner-only files written for the engine (its key), removed when start-up ends.
        self._private_paths: list[str] = []
        #: The run folder, held from the start-up on: the record a stop reads comes through it.
        self._folder: safefiles.Folder | None = None
        #: The launch record as written right after the spawn: a stop goes by it when the file
        #: cannot be read back (refused or gone since), so a spawned engine is always stoppable.
        self._spawned: RunState | None = None
        self._detached = False

    # --- what callers read -------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self.config.url

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    def state(self) -> RunState:
        """The recorded state (raises StopError when nothing was launched)."""
        return self.state_file.read()

    def returncode(self) -> int | None:
        """The engine's exit code once it has exited (negative: killed by that signal), else None.

        Looks without reaping: the exited leader stays a zombie until the stop, so its process
        group keeps a recorded member and stays provably ours (see ``procs.group_is_ours``).
        """
        if self._popen is None:
            return None
        if self._popen.returncode is not None:
            return self._popen.returncode
        try:
            info = os.waitid(os.P_PID, self._popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return self._popen.poll()
        if info is None or info.si_pid == 0:
            return None
        return -info.si_status if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else info.si_status

    def cancel(self) -> None:
        """Ask a launch in progress to give up (it then stops what it started). Signal-handler safe."""
        self._cancel.set()

    # --- launch --------------------------------------------------------------------------------

    def _get_probe(self) -> GpuProbe:
        if self._probe is None:
            from harvest.gpu import open_probe

            self._probe = open_probe()
        return self._probe

    def launch(self) -> Server:
        """Preflight, spawn, record, wait for readiness. Raises PreflightFailed or LaunchError;
        after a LaunchError the verified stop has already run (see :attr:`stop_report`)."""
        if self._launched:
            raise RuntimeError("this Server was already launched; make a new one")
        self._launched = True
        try:
            return self._launch()
        except LaunchError as exc:
            emit(self.on_event, "launching", "end", ok=False, reason=exc.reason)
            if self._popen is not None and not self._cancel.is_set():
                self._mark(RunStatus.FAILED, f"{exc.reason}: {str(exc).splitlines()[0]}")
            self.shutdown()
            raise
        except BaseException:
            self.shutdown()
            raise

    def _refuse_missing_executable(self) -> None:
        """A LaunchError naming the engine's executable, where it was looked for and where it comes
        from, when it cannot be started (a missing llama-server, a [server] python that is not there)."""
        cfg = self.config
        try:
            argv0 = self.adapter.argv(cfg, run_dir=None)[0]
        except Exception:  # noqa: BLE001 - an adapter that needs its run folder: the spawn says it
            return
        why = missing_executable(argv0, {**os.environ, **cfg.env})
        if why is None:
            return
        field = ("[server] command" if cfg.command else
                 "[server] python" if cfg.python else f"engine {cfg.engine!r}")
        raise LaunchError(f"{argv0} {why} ({field}): {ENGINE_SOURCES.get(cfg.engine, ENGINE_SOURCES['command'])}",
                          argv=[argv0], reason="spawn_failed")

    def _launch(self) -> Server:
        """The steps of :meth:`launch` in order; what a failed step started is stopped by the caller."""
        cfg = self.config
        if not self.adapter.launched:
            self.ready = wait_ready(config=cfg, checks=self.adapter.readiness(cfg), fatal_patterns=(), log=None,
                                    poll_exit=lambda: None, deadline_s=cfg.ready_timeout,
                                    cancelled=self._cancel.is_set)
            return self

        self._refuse_public_without_key()
        index = hold_index()  # a state dir another user owns is refused before anything is launched
        folder = self._hold_run_dir()
        run_dir = folder.path
        self._refuse_missing_executable()  # before preflight: a launch that cannot start says why at once
        probe = self._get_probe()
        self._preflight(probe, run_dir)
        version = self._engine_version()
        gpus = list(cfg.gpus) or [g.index for g in probe.snapshot().gpus]
        key = cfg.api_key()
        secrets = [key.get_secret_value()] if key is not None else []
        self._write_private_files(folder)
        argv = self.adapter.argv(cfg, run_dir=run_dir)
        shown = redact_argv(argv, secrets)
        env = {**os.environ, **self.adapter.environment(cfg), **cfg.env}
        pid = self._spawn(folder, probe, argv, env, shown, gpus, version)
        try:
            register_run(run_dir, cfg.engine, cfg.port, index)
        finally:
            index.close()
        emit(self.on_event, "launching", "start", engine=cfg.engine, pid=pid, url=cfg.url)
        self._recorder = DescendantRecorder(self.state_file, self.record_interval)
        self._recorder.start()

        watcher = LogWatcher(run_dir / LOG_FILE, secrets=[*secrets, *secret_env_values(cfg.env)],
                             via=folder.via(LOG_FILE))
        ready = self._wait_for_readiness(watcher, shown)
        self._record_ready(ready, watcher)
        return self

    def _refuse_public_without_key(self) -> None:
        """A non-loopback host is served only with its API key set (the config checked the name)."""
        cfg = self.config
        if not is_loopback(cfg.host) and cfg.api_key() is None:
            name = f"[server] {'api_key_env' if cfg.api_key_env else 'host'}"
            why = (f"environment variable {cfg.api_key_env} is not set (or empty): serving host "
                   f"{cfg.host!r}, not a loopback address, needs an API key")
            raise ConfigError(name, [(name, why)])

    def _hold_run_dir(self) -> safefiles.Folder:
        """The run folder, held from here on (the record and the log are written through it);
        refused when it holds the record of a server still running. A folder the caller holds is
        used as it is, never looked up again by its name."""
        folder = self._given if self._given is not None else make_run_dir(self.run_dir)
        self._folder = folder
        self.state_file = StateFile(folder)
        _refuse_live_record(folder)
        # Every file the launch will write, refused now rather than after the spawn.
        check_run_files(folder, private_files(self.adapter, self.config))
        return folder

    def _preflight(self, probe: GpuProbe, run_dir: Path) -> None:
        """The launch-safety rules: a failure is refused (PreflightFailed) unless ``force``."""
        from harvest.gpu.preflight import run_preflight

        emit(self.on_event, "preflight", "start")
        report = run_preflight(self.config, self.preflight_config, probe=probe, output_dir=run_dir,
                               paths=engine_paths(self.config))
        self.preflight_report = report
        emit(self.on_event, "preflight", "end", ok=report.passed, passed=report.passed,
             rules=len(report.results), failures=len(report.failures), forced=self.force)
        if self.on_preflight is not None:
            self.on_preflight(report)
        if not report.passed:
            if not self.force:
                raise PreflightFailed(report.results)
            log.warning("preflight failed, launching anyway (force): %s",
                        "; ".join(f"{r.rule}: {r.detail}" for r in report.failures))

    def _engine_version(self) -> str | None:
        """The engine's version (None: unknown), with a warning when it is newer than the pinned one."""
        version = self.adapter.version(self.config)
        newer = version_warning(self.config.engine, version)
        if newer is not None:
            log.warning("%s", newer)
        return version

    def _write_private_files(self, folder: safefiles.Folder) -> None:
        """E.g. SGLang's key, kept off the argv; removed once start-up ended (read at the start)."""
        for name, text in private_files(self.adapter, self.config).items():
            self._private_paths.append(name)
            with folder.open_text(name, "w") as fh:  # readable by its owner only (0600 from the first byte)
                fh.write(text)

    def _spawn(self, folder: safefiles.Folder, probe: GpuProbe, argv: list[str], env: dict[str, str],
               shown: tuple[str, ...], gpus: list[int], version: str | None) -> int:
        """Measure the GPU baseline, start the engine in a new session with its output to the log,
        and write its launch record, all under the spawn lock (a shutdown waits for the record);
        returns the engine's pid."""
        cfg = self.config
        log_path = folder.path / LOG_FILE
        with self._spawn_lock:
            if self._cancel.is_set():
                raise LaunchError("start-up was cancelled before the spawn", argv=shown, reason="cancelled")
            number = keep_last_launch(folder)  # the last launch's log, record and stop report kept
            baseline = probe.memory_used(gpus) if gpus else {}
            fd = folder.open(LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            try:
                self._popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=subprocess.STDOUT,
                                               env=env, start_new_session=True, close_fds=True)
            except OSError as exc:
                raise LaunchError(f"cannot start the engine: {exc}", argv=shown, log_path=str(log_path),
                                  reason="spawn_failed") from None
            finally:
                os.close(fd)
            pid = self._popen.pid
            create_time = psutil.Process(pid).create_time()  # our unreaped child: the pid cannot be reused
            record = LaunchRecord(
                engine=cfg.engine, pid=pid, pgid=os.getpgid(pid), create_time=create_time, argv=shown,
                host=cfg.host, port=cfg.port, url=cfg.url, gpus=tuple(gpus), baseline_mib=dict(baseline),
                engine_version=version, started_at=time.time(), log_path=str(log_path),
                stop_grace=cfg.stop_grace, stop_deadline=cfg.stop_deadline, launcher_pid=os.getpid(),
                launch=number,
            )
            self._spawned = RunState(record=record, status=RunStatus.STARTING)
            self.state_file.write(self._spawned)  # refused or failed: the stop goes by _spawned
        return pid

    def _wait_for_readiness(self, watcher: LogWatcher, shown: tuple[str, ...]) -> Ready:
        """Wait for the adapter's readiness checks, failing fast on exit or a fatal log line; the
        private files go once start-up ended, ready or not."""
        cfg = self.config
        try:
            self.ready = wait_ready(config=cfg, checks=self.adapter.readiness(cfg),
                                    fatal_patterns=self.adapter.fatal_patterns, log=watcher,
                                    poll_exit=self.returncode, deadline_s=cfg.ready_timeout, argv=shown,
                                    cancelled=self._cancel.is_set,
                                    on_poll=LaunchReporter(self.on_event, cfg.url))
        finally:
            self._remove_private()
        return self.ready

    def _record_ready(self, ready: Ready, watcher: LogWatcher) -> None:
        """The KV capacity learnt (from the log or the API; unknown is only a warning), and the
        record marked ready."""
        with SyncHttp(max_connections=1) as client:
            try:
                self.kv_capacity_tokens = self.adapter.kv_capacity(self.config, log_text=watcher.text(),
                                                                   client=client)
            except (HttpError, ValueError) as exc:
                log.warning("KV capacity unknown: %s", exc)
        kv = self.kv_capacity_tokens
        self.state_file.update(lambda s: replace(s, status=RunStatus.READY, kv_capacity_tokens=kv))
        emit(self.on_event, "launching", "end", seconds=ready.seconds, kv_capacity_tokens=kv)

    def _remove_private(self) -> None:
        for name in self._private_paths:
            try:
                if self._folder is not None:
                    self._folder.unlink(name)
            except OSError as exc:
                log.warning("could not remove %s: %s", self.run_dir / name, exc)
        self._private_paths.clear()

    def _mark(self, status: RunStatus, note: str | None = None) -> None:
        try:
            self.state_file.set_status(status, note)
        except (OSError, StopError, UnsafePathError) as exc:
            log.warning("could not record status %s: %s", status.value, exc)

    # --- stop ------------------------------------------------------------------------------------

    def shutdown(self, deadline: float | None = None) -> StopReport | None:
        """Verified stop of what this Server launched; idempotent (later calls return the same report).

        Returns None when nothing was launched (an endpoint, a refused preflight) or after detach.
        """
        self._remove_private()
        with self._stop_lock:
            if self._finished:
                return self.stop_report
            self._finished = True
            self._cancel.set()
            if self._recorder is not None:
                self._recorder.stop()
            try:
                if self._detached:
                    return None
                got = self._spawn_lock.acquire(timeout=SPAWN_LOCK_TIMEOUT)
                try:
                    launched = self._popen is not None
                finally:
                    if got:
                        self._spawn_lock.release()
                if not launched:
                    return None
                emit(self.on_event, "stopping", "start", pid=self.pid)
                self.stop_report = stop_run(self._folder or self.run_dir, deadline=deadline, probe=self._probe,
                                            margin_mib=self.stop_margin_mib, on_step=self._stop_step,
                                            known=self._spawned)
                emit(self.on_event, "stopping", "end", ok=self.stop_report.clean,
                     verdict=self.stop_report.verdict, seconds=self.stop_report.total_s)
                if self._popen is not None:
                    try:  # reap our direct child so it does not linger as a zombie
                        self._popen.wait(timeout=0.5)
                    except subprocess.TimeoutExpired:
                        pass
                return self.stop_report
            finally:
                self._close_probe()

    def _stop_step(self, name: str, step: StopStep | None) -> None:
        emit(self.on_event, "stopping", "update", step=name, outcome=step.outcome if step else None)

    def detach(self) -> None:
        """Leave the server running: stop recording here (the caller arranges a watcher) and make
        later shutdown calls do nothing. ``harvest stop RUN_DIR`` stops it from the state file."""
        with self._stop_lock:
            self._detached = True
            if self._recorder is not None:
                self._recorder.stop()
            self._finished = True
            self._close_probe()

    def record_watcher(self, ref: ProcessRef) -> None:
        self.state_file.update(lambda s: replace(s, watcher=ref))

    def _close_probe(self) -> None:
        if self._own_probe and self._probe is not None:
            self._probe.close()
            self._probe = None

    # --- async -----------------------------------------------------------------------------------

    async def start(self) -> Server:
        """``launch`` in a worker thread; on any failure or cancellation the verified stop runs."""
        try:
            await asyncio.to_thread(self.launch)
        except BaseException:
            self._cancel.set()
            await asyncio.shield(asyncio.to_thread(self.shutdown))
            raise
        return self

    async def stop(self, deadline: float | None = None) -> StopReport | None:
        """``shutdown`` in a worker thread, shielded from cancellation; idempotent."""
        return await asyncio.shield(asyncio.to_thread(self.shutdown, deadline))

    async def __aenter__(self) -> Server:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    def __enter__(self) -> Server:
        return self.launch()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.shutdown()


__all__ = ["DescendantRecorder", "RECORD_INTERVAL", "Server", "check_run_dir"]
