"""A far host: harvest's own JSON commands run there, through OpenSSH's client and/or an exec prefix.

    host = FarHost(HostConfig(ssh="root@gpu-box", exec_prefix=["pct", "exec", "101", "--"]))
    host.handshake()                          # same harvest version and JSON schemas, or RemoteError
    doc = host.call("gpus", ["gpus", "--json"])

Each call is one process on this machine: ``ssh [options] user@name -- PREFIX harvest ARGS`` (or,
without ``ssh``, ``PREFIX harvest ARGS`` here). Its budget: the connection gets
``connect_timeout`` (OpenSSH's ConnectTimeout also covers the banner and key exchange), the
command ``command_timeout`` (plus what the step itself may take, e.g. a launch's ready timeout);
past the budget the near client process (started here, in its own session) is killed and the step
fails with one line naming host, step and the time waited. A timed-out step is never retried.

What this module signals: only the client process it started, by its own process group, and
only after that process's budget ran out. It never signals a far process: stopping what runs
there is the far harvest's ``stop --json``, which runs beside what it stops.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import subprocess
import time
from typing import Any

from harvest import schemas
from harvest.version import __version__
from harvest.config import HostConfig
from harvest.errors import RemoteError

#: The JSON schemas the near side reads from the far side; the handshake compares them.
SCHEMAS: dict[str, str] = dict(schemas.FAR)
#: Seconds a killed client process is given to be reaped.
REAP_S = 5.0
#: ssh's exit status for its own errors (connection, authentication).
SSH_ERROR = 255


version_payload = schemas.version_payload


def ssh_base(cfg: HostConfig, *, connect_timeout: float | None = None) -> list[str]:
    """OpenSSH client argv up to (and including) the destination. The user's ``ssh_options`` come
    first: OpenSSH keeps the first value it reads for an option."""
    assert cfg.ssh is not None
    ct = connect_timeout if connect_timeout is not None else cfg.connect_timeout
    argv = ["ssh", "-p", str(cfg.port)]
    for opt in cfg.ssh_options:
        argv += ["-o", opt]
    if cfg.identity_file:
        argv += ["-i", os.path.expanduser(cfg.identity_file), "-o", "IdentitiesOnly=yes"]
    argv += ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, math.ceil(ct))}",
             "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "-T"]
    return argv + [cfg.ssh]


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


class FarHost:
    """One far host (``[host]`` table): runs far harvest commands, each bounded, and reads their JSON."""

    def __init__(self, config: HostConfig):
        self.config = config
        self.label = config.label
        self._checked = False

    @property
    def is_ssh(self) -> bool:
        return self.config.ssh is not None

    def far_argv(self, args: list[str]) -> list[str]:
        """The argv run on the far side: exec prefix, the far harvest, the arguments."""
        harvest = shlex.split(self.config.harvest) or ["harvest"]
        return [*self.config.exec_prefix, *harvest, *args]

    def argv(self, args: list[str]) -> list[str]:
        """The argv run on this machine for one far command."""
        far = self.far_argv(args)
        if not self.is_ssh:
            return far
        return [*ssh_base(self.config), "--", shlex.join(far)]

    def run(self, step: str, args: list[str], *, stdin: bytes | None = None,
            extra_s: float = 0.0) -> subprocess.CompletedProcess[bytes]:
        """Run one far command; returns its result whatever its exit status, or raises RemoteError
        when it could not run (no connection, refused key, missing harvest) or gave no answer in
        ``connect_timeout + command_timeout + extra_s`` seconds."""
        cfg = self.config
        budget = (cfg.connect_timeout if self.is_ssh else 0.0) + cfg.command_timeout + extra_s
        argv = self.argv(args)
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True, close_fds=True)
        except OSError as exc:
            raise RemoteError(self.label, step, 0.0, f"cannot start {argv[0]!r}: {exc.strerror or exc}",
                              exit_code=2) from None
        try:
            out, err = proc.communicate(stdin or b"", timeout=budget)
        except subprocess.TimeoutExpired:
            self._kill_client(proc)
            waited = time.monotonic() - t0
            what = "ssh client" if self.is_ssh else "exec prefix"
            raise RemoteError(self.label, step, waited, f"no answer within {budget:g} s "
                              f"(connect_timeout {cfg.connect_timeout:g} + command_timeout "
                              f"{cfg.command_timeout:g}{f' + {extra_s:g}' if extra_s else ''}); "
                              f"the {what} was stopped") from None
        waited = time.monotonic() - t0
        text = err.decode("utf-8", "replace")
        if self.is_ssh and proc.returncode == SSH_ERROR:
            raise self._ssh_failure(step, waited, text)
        if proc.returncode in (126, 127):
            raise RemoteError(self.label, step, waited, f"the far command could not be run "
                              f"(exit {proc.returncode}: {_last_line(text) or 'not found'}); check `harvest` "
                              f"and `exec_prefix` of the host table", exit_code=2)
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def _ssh_failure(self, step: str, waited: float, stderr: str) -> RemoteError:
        line = _last_line(stderr) or "ssh exited with 255"
        low = stderr.lower()
        # OpenSSH reports its errors only as text; these are its wordings for a refused key and a
        # host it could not reach. Anything else is reported as it came.
        if "permission denied" in low or "too many authentication failures" in low:
            return RemoteError(self.label, f"{step} (ssh login)", waited,
                               f"the key was refused ({line}); check identity_file and the far "
                               f"authorized_keys", exit_code=2)
        if "host key verification failed" in low or "identification has changed" in low:
            return RemoteError(self.label, f"{step} (ssh host key)", waited, line, exit_code=2)
        if "timed out" in low or "timeout" in low:
            return RemoteError(self.label, f"{step} (ssh connect)", waited,
                               f"no answer within connect_timeout {self.config.connect_timeout:g} s ({line})")
        return RemoteError(self.label, f"{step} (ssh)", waited, line)

    @staticmethod
    def _kill_client(proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL the near client process group this module started (never a far process)."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # start_new_session: its pid is its group; unreaped, so ours
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.communicate(timeout=REAP_S)
        except subprocess.TimeoutExpired:
            pass

    def call(self, step: str, args: list[str], *, stdin: bytes | None = None, extra_s: float = 0.0,
             ok_codes: tuple[int, ...] = (0,), schema: str | None = None) -> dict[str, Any]:
        """Run a far ``--json`` command and return its document (checked against ``schema``)."""
        if not self._checked and step != "handshake":
            self.handshake()
        t0 = time.monotonic()
        res = self.run(step, args, stdin=stdin, extra_s=extra_s)
        waited = time.monotonic() - t0
        err = res.stderr.decode("utf-8", "replace")
        try:
            doc = json.loads(res.stdout.decode("utf-8", "replace"))
        except ValueError:
            doc = None
        if res.returncode not in ok_codes or not isinstance(doc, dict):
            detail = _last_line(err) or f"exit {res.returncode}, no JSON document"
            code = 2 if res.returncode == 2 else 1
            raise RemoteError(self.label, step, waited, f"far harvest exited {res.returncode}: {detail}",
                              exit_code=code)
        if schema is not None and doc.get("schema") != schema:
            raise RemoteError(self.label, step, waited, f"far answer has schema {doc.get('schema')!r}, "
                              f"expected {schema!r}", exit_code=2)
        return doc

    def handshake(self) -> dict[str, Any]:
        """Refuse a far harvest whose version or JSON schemas differ from this one, naming both."""
        doc = self.call("handshake", ["version", "--json"])
        if doc.get("version") != __version__ or doc.get("schemas") != SCHEMAS:
            theirs = doc.get("schemas") or {}
            diff = sorted(k for k in set(SCHEMAS) | set(theirs) if SCHEMAS.get(k) != theirs.get(k))
            raise RemoteError(self.label, "handshake", 0.0,
                              f"far harvest {doc.get('version')!r} differs from this harvest {__version__!r}"
                              + (f" (schemas differ: {', '.join(diff)})" if diff else "")
                              + "; install the same harvest on both ends", exit_code=2)
        self._checked = True
        return doc


__all__ = ["FarHost", "SCHEMAS", "ssh_base", "version_payload"]
