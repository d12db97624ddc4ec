"""The far half of a server on a Ray cluster: the actor that runs harvest's supervisor on its node.

One :class:`ServerActor` per server, placed by the driver (:mod:`harvest.placement.ray.servers`)
in its own placement group. On its node it runs :class:`harvest.server.Server` exactly as
``harvest serve`` would: preflight there (that node's GPU memory, RAM, disk and port), launch,
readiness, and at the end the verified stop there, whose StopReport goes back as JSON
(``StopReport.to_dict``). The GPUs are the ones Ray assigned to the actor (``ray.get_gpu_ids()``),
never guessed; the bind address is the node's own IP as Ray knows it (the driver must reach it); the
port is the first of ``[server] port + offset, +1, ...`` the engine could bind (a launch refused
for "address in use" moves to the next).

This module imports Ray only inside the actor's methods (the actor runs where Ray is, by
definition) and never signals a process itself: the supervisor does, by its record.
"""

from __future__ import annotations

import os
import threading
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harvest.config import PreflightConfig, ServerConfig
from harvest.errors import LaunchError, PreflightFailed
from harvest.version import __version__

if TYPE_CHECKING:  # imported by the actor's launch, on its node
    from harvest.server import Server

#: Ports tried per launch (``port + offset + k``) when the engine reports "address in use".
PORT_TRIES = 16


def node_run_dir(run_id: str, name: str) -> Path:
    """Where the actor keeps its server's run folder on its node (under harvest's state dir)."""
    from harvest.server import state_dir

    return state_dir() / "ray" / run_id / name


class ServerActor:
    """One supervised engine server on the node Ray placed this actor on (a threaded actor: ``poll``
    and ``stop`` answer while ``launch`` runs)."""

    def __init__(self, doc: dict[str, Any]):
        if doc.get("version") != __version__:
            raise RuntimeError(f"harvest {__version__} on this node, {doc.get('version')} on the driver: install "
                               f"the same harvest on every node (or ship it with [cluster] runtime_env)")
        self.server_doc: dict[str, Any] = doc["server"]
        self.preflight = PreflightConfig.model_validate(doc["preflight"]) if doc.get("preflight") else None
        self.force = bool(doc.get("force"))
        self.name: str = doc["name"]
        self.run_id: str = doc["run_id"]
        self.port_offset = int(doc.get("port_offset", 0))
        self.server: Server | None = None
        self.info: dict[str, Any] | None = None
        self.last_error: str | None = None
        self._lock = threading.Lock()
        self._stopped = False

    def where(self) -> dict[str, Any]:
        """Node id, node IP, the GPUs Ray assigned and this actor's pid (no launch)."""
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "node_ip": ray.util.get_node_ip_address(),
                "gpus": [int(g) for g in ray.get_gpu_ids()], "actor_pid": os.getpid(), "version": __version__}

    def launch(self, api_key: str | None = None) -> dict[str, Any]:
        """Preflight, launch and readiness on this node; returns the endpoint and what was measured.
        Raises PreflightFailed or LaunchError (they reach the driver wrapped in Ray's RayTaskError)."""
        from harvest.server import Server

        here = self.where()
        env_name = self.server_doc.get("api_key_env")
        if env_name and api_key:
            os.environ[env_name] = api_key  # this actor's process only; never written down
        base = {**self.server_doc, "host": here["node_ip"], "gpus": here["gpus"]}
        folder = node_run_dir(self.run_id, self.name)
        port0 = int(self.server_doc.get("port", 8000)) + self.port_offset
        last: Exception | None = None
        for k in range(PORT_TRIES):
            port = port0 + k
            if port > 65535:
                break
            cfg = ServerConfig.model_validate({**base, "port": port})
            server = Server(cfg, run_dir=folder / f"port-{port}", preflight=self.preflight, force=self.force)
            with self._lock:
                if self._stopped:
                    raise LaunchError(f"{self.name}: stopped before its launch", reason="cancelled")
                self.server = server
            try:
                server.launch()
            except LaunchError as exc:
                if exc.reason != "port_in_use":
                    self.last_error = str(exc)
                    raise
                last = exc
                continue
            except PreflightFailed as exc:
                if exc.failed_rules != ["port"]:
                    self.last_error = str(exc)
                    raise
                last = exc
                continue
            with self._lock:
                if self._stopped:  # stop() came while the launch ran: it found nothing to stop then
                    server.shutdown()
                    raise LaunchError(f"{self.name}: stopped during its launch", reason="cancelled")
            self.info = {**here, "url": cfg.url, "port": port, "pid": server.pid, "run_dir": str(server.run_dir),
                         "ready_s": server.ready.seconds if server.ready is not None else None,
                         "kv_capacity_tokens": server.kv_capacity_tokens, "name": self.name,
                         "engine": cfg.engine, "started_at": server.state().record.started_at}
            report = server.preflight_report  # the node's own, shown by the driver as a local one would be
            return {**self.info, "preflight": asdict(report) if report is not None else None}
        raise LaunchError(f"{self.name}: no free port from {port0} ({PORT_TRIES} tried): {last}",
                          reason="port_in_use")

    def poll(self) -> dict[str, Any]:
        """The engine's exit code as the supervisor measures it now (None: running), and the record."""
        server = self.server
        code = server.returncode() if server is not None and self.info is not None else None
        return {"returncode": code, "info": self.info, "stopped": self._stopped}

    def stop(self, deadline: float | None = None) -> dict[str, Any] | None:
        """The verified stop on this node (idempotent); its StopReport as a dict, None if nothing ran."""
        with self._lock:
            self._stopped = True
            server = self.server
        if server is None:
            return None
        server.cancel()  # a launch still in progress gives up and stops what it started
        report = server.shutdown(deadline)
        return report.to_dict() if report is not None else None


__all__ = ["PORT_TRIES", "ServerActor", "node_run_dir"]
