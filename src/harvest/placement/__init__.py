"""Where servers run: the one seam every command asks (local, SSH hosts / containers, Ray).

    placement = from_config(cfg, Flags(host=..., cluster=...))   # chosen once, from the config + flags
    placement = from_record(run_dir)                               # ... or from a run folder's record
    placement.kind                 # "local", "ssh" or "ray" (a record's tag; callers never test it)
    placement.gpus(); placement.preflight(cfg); placement.ps(show_all)   # one result type for every kind
    make = placement.fleet()       # make(server_cfg, run_dir=..., ...) -> Fleet (endpoints, stop reports)
    placement.stop(run_dir)        # one verified StopReport per server

A command chooses its placement once and passes it down (``run_campaign``, ``tune``, ``compare``,
``harvest serve`` take it); nothing below the command chooses again.

The kinds (:mod:`.local`, :mod:`.ssh`, :mod:`.ray`) offer the same verbs and never import each
other; they are imported here lazily by name (an optional dependency, Ray, only when its kind is
chosen). No module outside this package tests ``cluster``, ``far_hosts()`` or a record file to
decide where something runs; a command that cannot work on a placement is refused with one line
(:class:`Refused`, exit 2), never run on this machine instead.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from harvest.config import ClusterConfig, HarvestConfig, HostConfig
from harvest.placement import record
from harvest.placement.base import (
    Answer,
    Flags,
    Fleet,
    FleetFactory,
    NothingToStop,
    Placement,
    OnPreflight,
    Readiness,
    Refused,
    engine_limit,
)

#: kind -> (module, class): the registry, imported on first use.
KINDS: dict[str, tuple[str, str]] = {
    "local": ("harvest.placement.local", "LocalPlacement"),
    "ssh": ("harvest.placement.ssh", "SshPlacement"),
    "ray": ("harvest.placement.ray", "RayPlacement"),
}


def _kind(name: str) -> Any:  # Any: the kind's Placement subclass, imported by name
    module, attr = KINDS[name]
    return getattr(importlib.import_module(module), attr)


def from_config(cfg: HarvestConfig | None, flags: Flags | None = None, *,
                otherwise: Placement | None = None) -> Placement:
    """The placement of a job (its ``[cluster]``, ``[host]`` / ``[[hosts]]``, else this machine),
    or of the command line's ``--host`` / ``--cluster``, which replace the config's own tables.
    ``otherwise``: the placement of a job that names none (a compare candidate runs where the
    reference runs) instead of this machine."""
    flags = flags or Flags()
    here = otherwise
    if flags.host is not None and flags.cluster is not None:
        raise Refused("--cluster", "give --cluster or --host, not both")
    if flags.host is not None:
        return _kind("ssh")([flags.host], "--host")
    if flags.cluster is not None:
        base = cfg.cluster if cfg is not None and cfg.cluster is not None else ClusterConfig()
        cluster = base.model_copy(update={"address": flags.cluster})
        return _kind("ray")(cluster, cfg.source if cfg is not None else "--cluster", config=cfg, timeout=flags.timeout)
    if cfg is None:
        return here or _kind("local")()
    if cfg.cluster is not None:
        return _kind("ray")(cfg.cluster, cfg.source, config=cfg, timeout=flags.timeout)
    hosts = cfg.far_hosts()
    if hosts:
        return _kind("ssh")(hosts, cfg.source)
    return here or _kind("local")()


def from_record(run_dir: Path | str) -> Placement:
    """The placement of a run folder, read from its record (``placement.json`` with its kind, or a
    local supervisor's ``launch.json``), looked for in the folder, ``server/`` and ``host-*/``.
    Raises Refused when the folder holds no record."""
    found = record.find(run_dir)
    kinds = {doc["kind"] for _, doc in found}
    if "ray" in kinds:
        doc = next(d for _, d in found if d["kind"] == "ray")
        cluster = ClusterConfig(address=doc["address"], namespace=doc["namespace"])
        return _kind("ray")(cluster, str(run_dir))
    if "ssh" in kinds:
        ssh = [(f, d) for f, d in found if d["kind"] == "ssh"]
        return _kind("ssh")([HostConfig.model_validate(d["host"]) for _, d in ssh], str(run_dir), records=ssh)
    if record.local_record_dir(run_dir) is not None:
        return _kind("local")()
    if not Path(run_dir).is_dir():
        raise Refused(str(run_dir), "no such folder")
    raise NothingToStop(str(run_dir), f"nothing to stop: no launch record in {run_dir} (no {record.RECORD}, "
                                      f"no launch.json there, in {record.SERVER_DIR}/ or in host-*/)")


__all__ = ["Answer", "Flags", "Fleet", "FleetFactory", "KINDS", "NothingToStop", "OnPreflight", "Placement",
           "Readiness", "Refused", "engine_limit", "from_config", "from_record"]
