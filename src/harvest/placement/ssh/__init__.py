"""Placement ``ssh``: servers on far boxes reached over SSH, or in containers through an exec prefix.

Every verb runs harvest's own JSON command on the far side (:mod:`harvest.placement.ssh.remote`,
bounded, one error line naming the host and the step) and reads its answer back into the same
records as a local run; far servers are reached through a tunnel
(:mod:`harvest.placement.ssh.tunnel`) and stopped by the far harvest, beside the processes.
Nothing here signals a process.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from harvest import safefiles
from harvest.config import HarvestConfig, HostConfig, PreflightConfig, ServerConfig
from harvest.events import Listener
from harvest.placement import record
from harvest.placement.base import Answer, Fleet, FleetFactory, OnPreflight, Placement, Refused
from harvest.placement.base_results import GpusByPlace, PreflightByPlace, one_answer
from harvest.placement.far_records import stop_report_from_dict
from harvest.placement.ssh.fleet import SshFleet, SshGroupFleet, ssh_fleet_factory
from harvest.placement.ssh.remote import SCHEMAS, FarHost
from harvest.placement.ssh.servers import KIND, RemoteServer, far_preflight, remote_stop, stop_far_leftovers
from harvest.server import StopReport

T = TypeVar("T")


def _each(hosts: list[HostConfig], work: Callable[[FarHost], T]) -> list[T]:
    """``work(FarHost)`` for every host at once; the first RemoteError (in host order) is raised."""
    with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
        futures = [pool.submit(work, FarHost(h)) for h in hosts]
    return [f.result() for f in futures]


class SshPlacement(Placement):
    """Servers on the ``[host]`` / ``[[hosts]]`` of a config (or the host of ``--host`` flags)."""

    kind: ClassVar[str] = KIND

    def __init__(self, hosts: list[HostConfig], source: str = "--host",
                 records: list[tuple[Path, dict[str, Any]]] | None = None):
        self.hosts = list(hosts)
        self.source = source
        #: The near records of a run folder (``from_record``): a stop goes by them.
        self.records = records

    def where(self) -> str:
        return ", ".join(h.label for h in self.hosts)

    def gpus(self) -> GpusByPlace:
        def measured(h: FarHost) -> tuple[str, dict[str, Any]]:
            doc = h.call("gpus", ["gpus", "--json"], schema=SCHEMAS["gpus"])
            return h.label, one_answer(doc, where=h.label, step="gpus")

        docs = _each(self.hosts, measured)
        return GpusByPlace(KIND, self.where(), "host", "GPUs by host", tuple(Answer(label, doc) for label, doc in docs))

    def preflight(self, cfg: HarvestConfig, *, output_dir: Path | None = None, wait_s: float | None = None,
                  on_wait: Callable[[], None] | None = None) -> PreflightByPlace:
        if wait_s is not None:
            raise Refused("--wait", f"--wait checks this machine; on {self.where()} each host is checked once")
        from harvest.gpu.payload import preflight_payload

        server = cfg.require_server()
        reports = _each(self.hosts, lambda h: (h.label, far_preflight(h, server, cfg.preflight)))
        docs = [(label, preflight_payload(rep, config=cfg.source, engine=server.engine)) for label, rep in reports]
        return PreflightByPlace(KIND, self.where(), "host",
                            f"preflight of {cfg.source} on {self.where()}: {server.engine} port {server.port}",
                            cfg.source, server.engine, tuple(Answer(label, doc) for label, doc in docs))

    def fleet(self, *, probe: bool = False, all_hosts: bool = False) -> FleetFactory:
        """Far servers, one per host; ``probe``: the first host only (tune / compare measure one
        server; ``note`` says so)."""
        return ssh_fleet_factory(self.hosts[:1] if probe else self.hosts, all_hosts=all_hosts)

    def note(self, probe: bool) -> str | None:
        if probe and len(self.hosts) > 1:
            return (f"every launch runs on {self.hosts[0].label}, the first of {len(self.hosts)} [[hosts]]: "
                    "tune and compare measure one server")
        return None

    def server(self, cfg: ServerConfig, *, run_dir: Path, preflight: PreflightConfig | None = None,
               force: bool = False, on_preflight: OnPreflight | None = None,
               on_event: Listener | None = None) -> Fleet:
        """One far server (``harvest serve``); several hosts are refused (``harvest run`` drives them)."""
        if len(self.hosts) != 1:
            raise Refused(f"{self.source} [[hosts]]", "harvest serve launches on one host; use [host] "
                                                      "(harvest run drives [[hosts]])")
        return super().server(cfg, run_dir=run_dir, preflight=preflight, force=force, on_preflight=on_preflight,
                              on_event=on_event)

    def ps(self, show_all: bool) -> list[dict[str, Any]]:
        args = ["ps", "--json"] + (["--all"] if show_all else [])
        docs = _each(self.hosts, lambda h: (h.label, h.call("ps", args, schema=SCHEMAS["ps"])))
        return [{**s, "where": label, "host": label} for label, doc in docs for s in doc["servers"]]

    def stop(self, run_dir: Path | None, *, deadline: float | None = None, **_: Any) -> list[StopReport]:
        """By a run folder's near records (``from_record``): each far server stopped there. Else
        ``harvest stop --config F [FAR_RUN_DIR]``: the far stop on the one host of F."""
        if self.records is not None:
            return stop_by_records(self.records, deadline)
        if len(self.hosts) != 1:
            raise Refused("--config", "stop acts on one host: name a config with one [host], or stop the "
                                      "run folder (its records name every host)")
        h = FarHost(self.hosts[0])
        args = ["stop", "--json"] + ([str(run_dir)] if run_dir is not None else [])
        if deadline is not None:
            args += ["--deadline", f"{deadline:g}"]
        doc = h.call("stop", args, ok_codes=(0, 1), schema=SCHEMAS["stop"], extra_s=deadline or 60.0)
        return [stop_report_from_dict(d, host=h.label) for d in doc.get("servers", [doc])]

    def leftovers(self, server_dir: Path | safefiles.Folder) -> list[StopReport]:
        return stop_far_leftovers(server_dir)


def stop_by_records(found: list[tuple[Path, dict[str, Any]]], deadline: float | None) -> list[StopReport]:
    """Stop every far server of a run folder by its near records (``harvest stop RUN_DIR``)."""
    out: list[StopReport] = []
    for folder, doc in found:
        if doc.get("status") in ("stopped", "not launched"):
            continue
        report = remote_stop(doc, deadline=deadline)
        doc["status"] = "stopped" if report.clean else "dirty"
        record.write(folder, KIND, {k: v for k, v in doc.items() if k not in ("kind", "schema")})
        out.append(report)
    return out


__all__ = ["KIND", "RemoteServer", "SshFleet", "SshGroupFleet", "SshPlacement", "stop_by_records"]
