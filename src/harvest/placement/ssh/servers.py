"""Far servers of the ``ssh`` placement: one per host, launched and stopped by the far harvest.

    server = RemoteServer(host, config.server, run_dir=..., preflight=..., force=..., on_preflight=...)
    await server.start(); server.urls; await server.stop()      # ServerGroup: one per [[hosts]] entry

The fleets the campaign sees of them are in :mod:`harvest.placement.ssh.fleet`.

A :class:`RemoteServer` is launched by the far harvest (``serve --detach --json``), so the
supervision, descendant tracking, GPU checks and the verified stop run beside the processes, by
the same code as here. The near side keeps a record of it (``placement.json``, kind ``ssh``, in the near server
folder: host, far run folder, far port), reaches it through a :class:`~harvest.placement.ssh.tunnel.Tunnel`
and stops it with the far ``stop --json``, whose StopReport it returns unchanged. After a dropped
session the tunnel is reopened and the far server is found again by that record (far ``ps --json``).

The record is written before the far launch, with the far run folder's name chosen here
(``serve --run-name``): a far serve that fails or is cut off by its budget is found again by that
name (far ``ps``) and what it left is stopped (far ``stop``) before the launch error is raised; the
far serve itself gives up (``--give-up-after``, stopping what it started) about when this side
stops waiting, so it does not start an engine nobody waits for.

Budgets: each far step is bounded by the host's ``connect_timeout + command_timeout`` plus what the
step itself may take (a launch its ``ready_timeout``, a stop its ``stop_deadline``); see
:mod:`harvest.placement.ssh.remote`. Nothing here signals a process on either side.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import signal
import threading
import time
from pathlib import Path, PurePosixPath
from typing import Any

import psutil

from harvest import safefiles
from harvest.checks import PreflightReport
from harvest.config import HostConfig, PreflightConfig, ServerConfig
from harvest.errors import LaunchError, PreflightFailed, RemoteError
from harvest.placement import record
from harvest.placement.base import OnPreflight
from harvest.placement.base import Readiness as RemoteReady
from harvest.placement.base_results import one_answer
from harvest.placement.far_records import preflight_report_from_dict, stop_report_from_dict
from harvest.placement.ssh.remote import SCHEMAS, FarHost
from harvest.placement.ssh.tunnel import Tunnel
from harvest.server import ProcessRef, StopReport, signal_verified, verified

log = logging.getLogger("harvest.hosts")

KIND = "ssh"
#: Seconds an earlier session's tunnel client gets to exit after each signal.
TUNNEL_END_TIMEOUT = 5.0


def far_config_doc(server: ServerConfig, preflight: PreflightConfig | None) -> bytes:
    """What the far harvest reads on stdin (``serve -`` / ``preflight -``): [server] and [preflight]."""
    doc: dict[str, Any] = {"server": server.model_dump(mode="json")}
    if preflight is not None:
        doc["preflight"] = preflight.model_dump(mode="json")
    return json.dumps(doc).encode()


def read_remote_record(folder: Path) -> dict[str, Any] | None:
    """The near record of a far server (None when the folder holds none)."""
    doc = record.read(folder)
    return doc if doc is not None and doc["kind"] == KIND else None


def _write_record(folder: record.Where, doc: dict[str, Any]) -> None:
    record.write(folder, KIND, doc)


def far_preflight(host: FarHost, server: ServerConfig, preflight: PreflightConfig | None) -> PreflightReport:
    """Run the far ``preflight --json -``; returns a PreflightReport (its details name the host)."""
    doc = host.call("preflight", ["preflight", "--json", "-"], stdin=far_config_doc(server, preflight),
                    ok_codes=(0, 1), schema=SCHEMAS["preflight"])
    return preflight_report_from_dict(one_answer(doc, where=host.label, step="preflight"), host=host.label)


def far_run_name(server: ServerConfig) -> str:
    """A fresh name for a far run folder (``serve --run-name``), chosen here before the launch."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{server.engine}-{server.port}-{secrets.token_hex(4)}"


def find_far_run(host: FarHost, name: str) -> dict[str, Any] | None:
    """The far ``ps --json --all`` row of the run folder called ``name`` (None: there is none)."""
    doc = host.call("ps", ["ps", "--json", "--all"], schema=SCHEMAS["ps"])
    return next((s for s in doc.get("servers", []) if PurePosixPath(str(s.get("run_dir", ""))).name == name),
                None)


def remote_stop(record: dict[str, Any], *, deadline: float | None = None) -> StopReport:
    """Stop a far server by its near record: the far ``stop --json`` runs beside it. A record made
    before its launch answered (no far run folder yet) finds the folder by its name first."""
    host = FarHost(HostConfig.model_validate(record["host"]))
    far_dir = record.get("far_run_dir")
    if not far_dir:
        row = find_far_run(host, str(record.get("far_run_name")))
        if row is None:
            raise RemoteError(host.label, "stop", 0.0, f"no far run folder named {record.get('far_run_name')!r}: "
                              "its launch never started the engine, nothing to stop", exit_code=2)
        far_dir = record["far_run_dir"] = row["run_dir"]
    args = ["stop", far_dir, "--json"]
    if deadline is not None:
        args += ["--deadline", f"{deadline:g}"]
    extra = deadline if deadline is not None else float(record.get("stop_deadline", 60.0))
    doc = host.call("stop", args, ok_codes=(0, 1), schema=SCHEMAS["stop"], extra_s=extra)
    listed = doc.get("servers")
    servers: list[Any] = listed if isinstance(listed, list) else [doc]
    if len(servers) != 1:
        raise RemoteError(host.label, "stop", 0.0, f"the far stop of {far_dir} reported {len(servers)} servers, "
                          "expected one", exit_code=2)
    return stop_report_from_dict(servers[0], host=host.label)


def _tunnel_doc(tunnel: Tunnel) -> dict[str, Any]:
    """The near record of a tunnel: its ssh client by pid and create time (ended by
    :func:`stop_far_leftovers` when the session that opened it was killed), its port, its reopens."""
    doc: dict[str, Any] = {"local_port": tunnel.local_port, "ssh_pid": tunnel.pid, "reopens": tunnel.reopens}
    if tunnel.pid is not None:
        with contextlib.suppress(psutil.Error):  # our own child, unreaped: the pid is still its own
            doc["ssh_create_time"] = psutil.Process(tunnel.pid).create_time()
    return doc


def _end_tunnel_client(record: dict[str, Any]) -> bool:
    """End the ssh client that carried an earlier session's tunnel (its own session, orphaned when
    that session was killed), by the pid and create time recorded at its launch; bounded. True when
    one was found and is gone now."""
    tunnel = record.get("tunnel") or {}
    pid, created = tunnel.get("ssh_pid"), tunnel.get("ssh_create_time")
    if not pid or created is None:
        return False
    ref = ProcessRef(int(pid), float(created))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not signal_verified([ref], sig):
            return sig != signal.SIGTERM
        end = time.monotonic() + TUNNEL_END_TIMEOUT
        while time.monotonic() < end:
            if verified(ref) is None:
                return True
            time.sleep(0.05)
    log.warning("the ssh client %s of an earlier session's tunnel outlived SIGKILL", pid)
    return False


def stop_far_leftovers(folder: Path | safefiles.Folder) -> list[StopReport]:
    """Stop, by their near records, far servers an earlier (killed) session of this run left running,
    and end the ssh clients that carried their tunnels."""
    found: list[tuple[record.Where, dict[str, Any]]] = (
        list(record.find_held(folder)) if isinstance(folder, safefiles.Folder) else list(record.find(folder)))
    out: list[StopReport] = []
    for sub, doc in found:
        if doc["kind"] != KIND or doc.get("status") not in ("ready", "launching", "unknown"):
            continue
        if _end_tunnel_client(doc):
            log.warning("ended the tunnel (ssh pid %s) left by an earlier session",
                        doc["tunnel"]["ssh_pid"])
        try:
            report = remote_stop(doc)
        except RemoteError as exc:
            log.warning("a far server of an earlier session was not stopped: %s", exc)
            continue
        doc["status"] = "stopped" if report.clean else "dirty"
        _write_record(sub, doc)
        log.warning("stopped the far server left running by an earlier session on %s: %s",
                    doc["host"].get("name") or doc["host"].get("ssh"), "clean" if report.clean else "DIRTY")
        out.append(report)
    return out


class RemoteServer:
    """One engine server the far harvest launched and supervises; the same lifecycle as Server."""

    def __init__(self, host: HostConfig, config: ServerConfig, *, run_dir: Path | str | safefiles.Folder,
                 preflight: PreflightConfig | None = None, force: bool = False,
                 on_preflight: OnPreflight | None = None, port_memo: dict[int, int] | None = None, port_key: int = 0, check_preflight: bool = True):
        self.host_config = host
        self.host = FarHost(host)
        self.config = host.server_config(config)
        #: The near records' folder, held by the caller (a campaign's), else written by its name.
        self.folder = run_dir if isinstance(run_dir, safefiles.Folder) else None
        self.run_dir = run_dir.path if isinstance(run_dir, safefiles.Folder) else Path(run_dir)
        self.preflight_config = preflight
        self.force = force
        self.on_preflight = on_preflight
        self.check_preflight = check_preflight
        self._port_memo = port_memo if port_memo is not None else {}
        self._port_key = port_key
        self.local_port: int | None = self._port_memo.get(port_key)
        self.tunnel: Tunnel | None = None
        self.preflight_report: PreflightReport | None = None
        self.ready: RemoteReady | None = None
        self.kv_capacity_tokens: int | None = None
        self.stop_report: StopReport | None = None
        self.record: dict[str, Any] | None = None
        self._exit: int | None = None
        self._lock = threading.Lock()
        self._finished = False
        self._detached = False
        self._cancelled = False

    @property
    def label(self) -> str:
        return self.host.label

    @property
    def url(self) -> str:
        if self.tunnel is not None:
            return self.tunnel.url
        return self.record["far_url"] if self.record else self.config.url

    @property
    def urls(self) -> list[str]:
        return [self.url]

    @property
    def client_config(self) -> ServerConfig:
        """[server] as this machine reaches it: the tunnel's local end for an SSH host (the far
        engine binds its own address there), else the far address itself."""
        if self.tunnel is None or self.local_port is None:
            return self.config
        return self.config.model_copy(update={"host": "127.0.0.1", "port": self.local_port})

    @property
    def pid(self) -> int | None:
        """The far leader's pid as the far side sees it (informative: never signalled from here)."""
        return self.record["far_pid"] if self.record else None

    def placed(self) -> list[dict[str, Any]]:
        return [{"where": self.label, "pid": self.pid, "url": self.record.get("far_url") if self.record else None}]

    def returncode(self) -> int | None:
        """-1 once a look at the far side (after a reopened tunnel) found the server gone, else None."""
        return self._exit

    def cancel(self) -> None:
        """Ask a launch in progress to give up: the far step in flight is bounded by the host's
        timeouts; once it returns, what it started is stopped by the far harvest."""
        self._cancelled = True

    def preflight(self) -> PreflightReport:
        """The far preflight of this server (its details name the host), told to ``on_preflight``."""
        report = far_preflight(self.host, self.config, self.preflight_config)
        self.preflight_report = report
        if self.on_preflight is not None:
            self.on_preflight(report)
        return report

    def launch(self) -> RemoteServer:
        """Handshake, far preflight (refused on failure unless ``force``), far ``serve --detach --json``,
        the near record, then the tunnel. Raises PreflightFailed, LaunchError or RemoteError."""
        self.host.handshake()
        if self.check_preflight:
            report = self.preflight()
            if not report.passed and not self.force:
                raise PreflightFailed(report.results)
        # The far run folder is named here and recorded before the far launch: a serve cut off by
        # the budget below is found again by that name (far ps) and stopped (far stop).
        name = far_run_name(self.config)
        self.record = {"host": self.host_config.model_dump(mode="json"), "far_run_name": name,
                       "far_run_dir": None, "engine": self.config.engine,
                       "stop_deadline": self.config.stop_deadline, "started_at": time.time(),
                       "status": "launching"}
        _write_record(self.folder or self.run_dir, self.record)
        # The far serve gives up (stopping what it started) about when this side stops waiting.
        give_up = self.host_config.command_timeout + self.config.ready_timeout
        args = ["serve", "--detach", "--json", "--run-name", name, "--give-up-after", f"{give_up:g}", "-"]
        args += ["--force"] if self.force else []
        try:
            doc = self.host.call("serve", args, stdin=far_config_doc(self.config, self.preflight_config),
                                 schema=SCHEMAS["serve"], extra_s=self.config.ready_timeout)
        except RemoteError as exc:
            raise LaunchError(f"far launch on {self.label}: {exc}; {self._clear_unfinished()}",
                              reason="exited") from None
        self.record.update({"far_run_dir": doc["run_dir"], "far_url": doc["url"], "far_port": int(doc["port"]),
                            "far_pid": int(doc["pid"]), "status": "ready"})
        self.ready = RemoteReady(float(doc.get("ready_s", 0.0)))
        self.kv_capacity_tokens = doc.get("kv_capacity_tokens")
        _write_record(self.folder or self.run_dir, self.record)
        with self._lock:
            gave_up = self._finished or self._cancelled
            self._finished = self._finished or gave_up
        if gave_up:  # cancelled (or shut down) while the far launch was in flight: stop it there
            self.stop_report = remote_stop(self.record)
            self.record["status"] = "stopped" if self.stop_report.clean else "dirty"
            _write_record(self.folder or self.run_dir, self.record)
            raise LaunchError(f"start-up on {self.label} was cancelled; the far server was stopped",
                              reason="cancelled")
        if self.host.is_ssh:
            self.tunnel = Tunnel(self.host_config, int(doc["port"]), local_port=self.local_port,
                                 on_reopen=self._found_again)
            try:
                self.local_port = self.tunnel.open()
            except RemoteError:
                self.shutdown()
                raise
            self._port_memo[self._port_key] = self.local_port
            self.record["tunnel"] = _tunnel_doc(self.tunnel)
            _write_record(self.folder or self.run_dir, self.record)
        return self

    def _clear_unfinished(self) -> str:
        """After a far serve that failed or gave no answer: find its run folder by the recorded name
        (far ``ps``) and stop what is left there (far ``stop``). Returns what was found and done."""
        assert self.record is not None
        try:
            row = find_far_run(self.host, self.record["far_run_name"])
            if row is None:
                self.record["status"] = "not launched"
                return "no far run folder by its name, nothing of it runs there (far ps)"
            self.record["far_run_dir"] = row["run_dir"]
            if not row["measured"]["alive"] and row["recorded"]["status"] in ("stopped", "failed"):
                self.record["status"] = "stopped"
                return f"nothing of it runs there (far ps: {row['run_dir']} {row['recorded']['status']})"
            self.stop_report = remote_stop(self.record)
            self.record["status"] = "stopped" if self.stop_report.clean else "dirty"
            return f"found {row['run_dir']} there and stopped it: {self.stop_report.verdict}"
        except RemoteError as exc:
            self.record["status"] = "unknown"
            return f"the far side could not be checked ({exc}); `harvest stop {self.run_dir}` stops what is left"
        finally:
            _write_record(self.folder or self.run_dir, self.record)

    def _found_again(self, tunnel: Tunnel) -> None:
        """After a reopen: find the far server again by its record (far ``ps --json``)."""
        assert self.record is not None
        doc = self.host.call("ps", ["ps", "--json", "--all"], schema=SCHEMAS["ps"])
        mine = [s for s in doc.get("servers", []) if s.get("run_dir") == self.record["far_run_dir"]]
        alive = bool(mine) and bool(mine[0]["measured"]["leader_alive"])
        log.warning("host %s: far server %s %s", self.label, self.record["far_run_dir"],
                    "found again, alive" if alive else "is gone")
        if not alive:
            self._exit = -1
        self.record["tunnel"] = _tunnel_doc(tunnel)
        _write_record(self.folder or self.run_dir, self.record)

    def shutdown(self, deadline: float | None = None) -> StopReport | None:
        """The far verified stop, then the tunnel closed; idempotent."""
        with self._lock:
            if self._finished:
                return self.stop_report
            self._finished = True
            try:
                if self.record is None or self._detached or self.record["status"] != "ready":
                    return self.stop_report  # nothing launched, or what a failed launch left was cleared
                self.stop_report = remote_stop(self.record, deadline=deadline)
                self.record["status"] = "stopped" if self.stop_report.clean else "dirty"
                _write_record(self.folder or self.run_dir, self.record)
                return self.stop_report
            finally:
                if self.tunnel is not None:
                    self.tunnel.close()

    def detach(self) -> None:
        """Leave the far server running (stop it later by the near record); the tunnel closes."""
        with self._lock:
            self._detached = self._finished = True
            if self.tunnel is not None:
                self.tunnel.close()

    async def start(self) -> RemoteServer:
        try:
            await asyncio.to_thread(self.launch)
        except BaseException:
            await asyncio.shield(asyncio.to_thread(self.shutdown))
            raise
        return self

    async def stop(self, deadline: float | None = None) -> StopReport | None:
        return await asyncio.shield(asyncio.to_thread(self.shutdown, deadline))


class ServerGroup:
    """One RemoteServer per ``[[hosts]]`` entry: preflight each (a failing host is named and left out,
    or the launch refused with ``all_hosts``), launch the rest together, stop them all."""

    def __init__(self, members: list[RemoteServer], *, run_dir: Path, all_hosts: bool = False, force: bool = False):
        self.members = members
        self.run_dir = Path(run_dir)
        self.kv_capacity_tokens: int | None = None
        self.all_hosts = all_hosts
        self.force = force
        self.running: list[RemoteServer] = []
        self.left_out: list[tuple[str, str]] = []
        self.ready: RemoteReady | None = None

    @property
    def urls(self) -> list[str]:
        return [m.url for m in self.running]

    @property
    def url(self) -> str:
        return self.urls[0]

    def placed(self) -> list[dict[str, Any]]:
        return [p for m in self.running for p in m.placed()]

    def returncode(self) -> int | None:
        codes = [m.returncode() for m in self.running]
        return -1 if codes and all(c is not None for c in codes) else None

    def cancel(self) -> None:
        for m in self.members:
            m.cancel()

    async def start(self) -> ServerGroup:
        reports = await asyncio.gather(*(asyncio.to_thread(m.preflight) for m in self.members),
                                       return_exceptions=True)
        chosen: list[RemoteServer] = []
        for m, rep in zip(self.members, reports):
            if isinstance(rep, BaseException):
                why = str(rep)
            elif not rep.passed and not self.force:
                why = "preflight failed: " + "; ".join(f"{r.rule}: {r.detail}" for r in rep.failures)
            else:
                chosen.append(m)
                continue
            self.left_out.append((m.label, why))
            log.warning("host %s left out: %s", m.label, why)
        if self.left_out and self.all_hosts:
            raise LaunchError("refused (--all-hosts): " + "; ".join(f"{h}: {w}" for h, w in self.left_out),
                              reason="spawn_failed")
        if not chosen:
            raise LaunchError("no host passed preflight: " + "; ".join(f"{h}: {w}" for h, w in self.left_out),
                              reason="spawn_failed")
        for m in chosen:
            m.check_preflight = False  # checked above; the far serve checks again as it launches
        started = await asyncio.gather(*(m.start() for m in chosen), return_exceptions=True)
        for m, res in zip(chosen, started):
            if isinstance(res, BaseException):
                self.left_out.append((m.label, str(res)))
                log.warning("host %s left out: %s", m.label, res)
            else:
                self.running.append(m)
        if not self.running:
            raise LaunchError("no host launched: " + "; ".join(f"{h}: {w}" for h, w in self.left_out),
                              reason="exited")
        self.ready = RemoteReady(max(m.ready.seconds for m in self.running if m.ready))
        self.kv_capacity_tokens = min((m.kv_capacity_tokens for m in self.running if m.kv_capacity_tokens),
                                      default=None)
        return self

    async def stop(self, deadline: float | None = None) -> list[StopReport]:
        got = await asyncio.gather(*(m.stop(deadline) for m in self.members), return_exceptions=True)
        out: list[StopReport] = []
        for m, r in zip(self.members, got):
            if isinstance(r, BaseException):
                log.error("host %s: stop failed: %s", m.label, r)
            elif r is not None:
                out.append(r)
        return out


__all__ = ["KIND", "RemoteServer", "ServerGroup", "far_preflight", "far_run_name", "find_far_run",
           "read_remote_record", "remote_stop", "stop_far_leftovers"]
