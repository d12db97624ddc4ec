"""Helpers for the supervisor tests: a `command` engine built on tests/server/fake_engine.py,
launches that retry on a port taken between choosing and binding, and measured process checks.

Every server launched through :class:`Launcher` is stopped in teardown through harvest's own
verified stop (idempotent when the test already stopped it); nothing is ever signalled by name.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from harvest.config import PreflightConfig, ServerConfig
from harvest.errors import LaunchError, PreflightFailed
from harvest.server import Server, StateFile, stop_run
from tests.engines import free_port

FAKE_ENGINE = Path(__file__).with_name("fake_engine.py")
#: Preflight settings for tests: the real rules, with a disk floor any CI machine meets.
TEST_PREFLIGHT = PreflightConfig(min_disk_free_gib=0.05)


def gone(pid: int, create_time: float | None = None) -> bool:
    """Measured: no such process, a zombie, or the pid now belongs to another process."""
    try:
        p = psutil.Process(pid)
        if create_time is not None and abs(p.create_time() - create_time) > 0.05:
            return True
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.05) -> object:
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def read_pid(pid_dir: Path, role: str, timeout: float = 15.0) -> int:
    path = pid_dir / f"{role}.pid"
    wait_for(lambda: path.exists(), timeout, f"{role}.pid")
    return int(path.read_text())


def fake_config(pid_dir: Path, *flags: str, port: int | None = None, **overrides: object) -> ServerConfig:
    """A `command` engine running fake_engine.py with ``flags``."""
    pid_dir.mkdir(parents=True, exist_ok=True)
    values: dict[str, object] = dict(
        engine="command",
        command=[sys.executable, str(FAKE_ENGINE), "--host", "{host}", "--port", "{port}",
                 "--pid-dir", str(pid_dir), *flags],
        health_url="http://{host}:{port}/health",
        port=port if port is not None else free_port(),
        ready_timeout=30.0, stop_grace=5.0, stop_deadline=20.0,
    )
    values.update(overrides)
    return ServerConfig(**values)  # type: ignore[arg-type]


def port_taken(exc: BaseException) -> bool:
    """Whether a launch failed because the chosen port was taken (by type and rule, not by text)."""
    if isinstance(exc, LaunchError):
        return exc.reason == "port_in_use"
    if isinstance(exc, PreflightFailed):
        failed = [r for r in exc.results if not r.passed]
        return bool(failed) and all(r.rule == "port" for r in failed)
    return False


class Launcher:
    """Launches fake (or real) servers for one test and stops whatever is left in teardown."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.servers: list[Server] = []
        self.count = 0

    def run_dir(self) -> Path:
        self.count += 1
        return self.tmp_path / f"run{self.count}"

    def launch(self, make_config: Callable[[int], ServerConfig], *, attempts: int = 4,
               preflight: PreflightConfig = TEST_PREFLIGHT, **server_kwargs: object) -> Server:
        """Launch ``make_config(port)``; choose another port when the chosen one was taken."""
        last: BaseException | None = None
        for _ in range(attempts):
            server = Server(make_config(free_port()), run_dir=self.run_dir(), preflight=preflight,
                            **server_kwargs)  # type: ignore[arg-type]
            self.servers.append(server)
            try:
                return server.launch()
            except (LaunchError, PreflightFailed) as exc:
                if not port_taken(exc):
                    raise
                last = exc
        raise AssertionError(f"no free port after {attempts} attempts: {last}")

    def cleanup(self) -> None:
        for server in self.servers:
            server.shutdown()
            sf = StateFile(server.run_dir)
            if sf.exists() and server.stop_report is None:
                stop_run(server.run_dir, deadline=15.0)
