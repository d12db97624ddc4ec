"""The ``ray`` kind's fleet: the servers of one run as Ray actors, and the factory the campaign calls.

    make = ray_fleet_factory(config)        # Ray imported now (a ClusterError if it is missing)
    fleet = make(config.server, run_dir=...); await fleet.start(); fleet.urls; await fleet.stop()

:class:`RayFleet` wraps a :class:`~harvest.placement.ray.servers.RayServerGroup` and answers the
:class:`~harvest.placement.base.Fleet` questions from it; unlike the other kinds it replaces lost
servers itself, so it counts those replacements against ``[run] max_relaunches`` and, once the
client exists (:meth:`RayFleet.attach`), points the client's endpoints at the replacements. The
groups of one factory share that budget and the client. Nothing here signals a process.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harvest import safefiles
from harvest.client import Client
from harvest.config import HarvestConfig, PreflightConfig, ServerConfig
from harvest.events import Listener
from harvest.placement.base import FarFleet, Fleet, FleetFactory, OnPreflight
from harvest.placement.ray.cluster import RayConnection, import_ray
from harvest.placement.ray.servers import RayServerGroup
from harvest.server import StopReport


class RayFleet(FarFleet):
    """The servers of one launch on a Ray cluster (every ready actor's endpoint)."""

    def __init__(self, group: RayServerGroup, *, where: str, on_event: Listener | None = None):
        super().__init__(group, group.server_config, run_dir=group.run_dir, where=where, on_event=on_event)
        self.group = group

    @property
    def replacements(self) -> int:
        return self.group.replacements

    def attach(self, client: Client) -> None:
        self.group.attach_client(client)

    def detach(self) -> None:
        self.group.detach()

    async def _start(self) -> None:
        await self.group.start()

    async def _stop(self, deadline: float | None) -> Sequence[StopReport | None]:
        return await self.group.stop(deadline)


def ray_fleet_factory(config: HarvestConfig, *, where: str) -> FleetFactory:
    """What the runner calls to get its servers on the cluster; Ray is imported now (a missing Ray
    is a ClusterError before anything else happens)."""
    cluster = config.cluster
    assert cluster is not None  # the placement chose the Ray kind from this table
    import_ray(config.source)
    budget: dict[str, Any] = {"relaunches": 0, "next_slot": 0}

    def make(cfg: ServerConfig, *, run_dir: Path | safefiles.Folder, preflight: PreflightConfig | None = None,
             force: bool = False, on_preflight: OnPreflight | None = None,
             on_event: Listener | None = None) -> Fleet:
        group = RayServerGroup(config, cfg, run_dir=run_dir if isinstance(run_dir, safefiles.Folder) else Path(run_dir), conn=RayConnection(cluster, config.source),
                               preflight=preflight, force=force, budget=budget, on_preflight=on_preflight)
        return RayFleet(group, where=where, on_event=on_event)

    return make


__all__ = ["RayFleet", "ray_fleet_factory"]
