"""The data path to a far engine: an SSH local port forward that harvest opens, watches and reopens.

    tunnel = Tunnel(host_config, far_port=8000)   # the far engine keeps binding 127.0.0.1
    tunnel.open()                                  # -> local port; http://127.0.0.1:PORT reaches it
    ...
    tunnel.close()

One ``ssh -N -L 127.0.0.1:LOCAL:FORWARD_TO:FAR_PORT`` client process (OpenSSH, chosen over
asyncssh by bench/tunnel.py: see BENCHMARKS.md P1-tunnel) in its own session, with
``ExitOnForwardFailure`` so a forward that cannot be set up ends the process instead of leaving it
half useful. Budgets: opening waits at most ``connect_timeout`` + 5 s for the local port to answer;
a local port taken by someone else between the choice and the bind is chosen again (at most
``BIND_TRIES`` times, never on a reopen: the client already holds the URL). A watcher thread
notices the process exiting (a dropped session, a killed client or far sshd child) and reopens on
the same local port after ``REOPEN_DELAY`` seconds (so that the client's health probe sees the
endpoint down, holds its requests uncharged, and recovers once the tunnel is back), trying for at
most ``reopen_deadline`` seconds per drop.

It signals only its own ssh client process (its group, started here, unreaped), to close it.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable

from harvest.config import HostConfig
from harvest.errors import RemoteError
from harvest.net import port_listening
from harvest.placement.ssh.remote import ssh_base

log = logging.getLogger("harvest.hosts")

BIND_TRIES = 5
#: Seconds between a drop being seen and the reopen.
REOPEN_DELAY = 1.0
#: Seconds between two looks at the client process.
WATCH_INTERVAL = 0.25


def _pick_port() -> int:
    """A local port free a moment ago; ssh binds it, and a clear 'in use' makes us pick again."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Tunnel:
    """An SSH local port forward to ``forward_to:far_port`` on the far host, kept open."""

    def __init__(self, config: HostConfig, far_port: int, *, local_port: int | None = None,
                 reopen_deadline: float = 120.0, on_reopen: Callable[[Tunnel], None] | None = None):
        if config.ssh is None:
            raise ValueError("a tunnel needs an SSH host")
        self.config = config
        self.far_port = far_port
        self.local_port = local_port
        self.reopen_deadline = reopen_deadline
        self.on_reopen = on_reopen
        #: Times the tunnel was reopened after a drop.
        self.reopens = 0
        #: The pid of the ssh client process now carrying the tunnel (for logs and fault tests).
        self.pid: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._watcher: threading.Thread | None = None
        self.error: RemoteError | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.local_port}"

    def argv(self, local_port: int) -> list[str]:
        base = ssh_base(self.config)
        dest = base.pop()
        return [*base, "-N", "-o", "ExitOnForwardFailure=yes",
                "-L", f"127.0.0.1:{local_port}:{self.config.forward_to}:{self.far_port}", dest]

    def open(self) -> int:
        """Open the forward (bounded); returns the local port. Raises RemoteError."""
        tries = BIND_TRIES if self.local_port is None else 1
        last = ""
        for _ in range(tries):
            port = self.local_port if self.local_port is not None else _pick_port()
            ok, last = self._start(port)
            if ok:
                self.local_port = port
                break
            if "in use" not in last.lower():
                break
        else:
            ok = False
        if not ok:
            raise RemoteError(self.config.label, "tunnel", self.config.connect_timeout, last or "ssh exited")
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name="harvest-tunnel", daemon=True)
            self._watcher.start()
        assert self.local_port is not None
        return self.local_port

    def _start(self, port: int) -> tuple[bool, str]:
        """One ssh client for ``port``; True once the local port answers."""
        budget = self.config.connect_timeout + 5.0
        # A file, not a pipe: a long-lived client's messages must never fill a pipe and block it.
        errfile = tempfile.TemporaryFile()
        proc = subprocess.Popen(self.argv(port), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=errfile, start_new_session=True, close_fds=True)
        end = time.monotonic() + budget
        while time.monotonic() < end:
            if proc.poll() is not None:
                errfile.seek(0)
                err = errfile.read()[-4000:].decode("utf-8", "replace")
                errfile.close()
                lines = [ln for ln in err.splitlines() if ln.strip()]
                return False, (lines[-1] if lines else f"ssh exited with {proc.returncode}")
            if port_listening("127.0.0.1", port, timeout=0.2):
                errfile.close()  # the client keeps its own descriptor
                with self._lock:
                    self._proc, self.pid = proc, proc.pid
                return True, ""
            time.sleep(0.05)
        self._kill(proc)
        errfile.close()
        return False, f"the forward did not answer within {budget:g} s"

    def alive(self) -> bool:
        proc = self._proc
        return proc is not None and proc.poll() is None

    def _watch(self) -> None:
        while not self._closed.wait(WATCH_INTERVAL):
            proc = self._proc
            if proc is None or proc.poll() is None:
                continue
            log.warning("host %s: the tunnel (ssh pid %s) ended with %s; reopening on port %s",
                        self.config.label, proc.pid, proc.returncode, self.local_port)
            if self._closed.wait(REOPEN_DELAY):
                return
            end = time.monotonic() + self.reopen_deadline
            while not self._closed.is_set():
                ok, why = self._start(self.local_port)  # type: ignore[arg-type]
                if ok:
                    self.reopens += 1
                    log.warning("host %s: tunnel reopened (ssh pid %s)", self.config.label, self.pid)
                    if self.on_reopen is not None:
                        try:
                            self.on_reopen(self)
                        except Exception as exc:  # noqa: BLE001 - the callback reports, never ends the watch
                            log.warning("host %s: after the reopen: %s", self.config.label, exc)
                    break
                if time.monotonic() >= end:
                    self.error = RemoteError(self.config.label, "tunnel reopen", self.reopen_deadline, why)
                    log.error("%s", self.error)
                    return
                if self._closed.wait(1.0):
                    return

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)  # our own ssh client, unreaped: its group is ours
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                pass

    def close(self) -> None:
        """End the forward and its watcher (idempotent)."""
        self._closed.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=self.config.connect_timeout + 10.0)
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None:
            self._kill(proc)


__all__ = ["Tunnel"]
