"""The ``ssh`` kind's fleets: one far server (``[host]``, ``--host``), or one per ``[[hosts]]`` entry.

    make = ssh_fleet_factory(hosts)        # SshFleet for one host, SshGroupFleet for several
    fleet = make(config.server, run_dir=..., preflight=..., force=..., on_preflight=...)
    await fleet.start(); fleet.urls; await fleet.stop()

Each wraps what :mod:`harvest.placement.ssh.servers` launches (:class:`RemoteServer`,
:class:`ServerGroup`) and answers the :class:`~harvest.placement.base.Fleet` questions from it: the
URLs are the tunnels' local ends, the settings each host's own. Nothing here signals a process.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from harvest import safefiles
from harvest.config import HostConfig, PreflightConfig, ServerConfig
from harvest.events import Listener
from harvest.placement.base import FarFleet, Fleet, FleetFactory, OnPreflight
from harvest.placement.ssh.servers import RemoteServer, ServerGroup
from harvest.server import StopReport


class SshFleet(FarFleet):
    """One far server, reached through its tunnel and stopped by the far harvest."""

    def __init__(self, server: RemoteServer, *, where: str, on_event: Listener | None = None):
        super().__init__(server, server.config, run_dir=server.run_dir, where=where, on_event=on_event,
                         server=server)
        self.server = server

    @property
    def server_configs(self) -> list[ServerConfig]:
        return [self.server.config]  # the host's own [server] overrides

    @property
    def client_config(self) -> ServerConfig:
        return self.server.client_config

    def detach(self) -> None:
        self.server.detach()


class SshGroupFleet(FarFleet):
    """The far servers of ``[[hosts]]``: the hosts that passed preflight and launched."""

    def __init__(self, group: ServerGroup, config: ServerConfig, *, where: str, on_event: Listener | None = None):
        super().__init__(group, config, run_dir=group.run_dir, where=where, on_event=on_event)
        self.group = group

    @property
    def server_configs(self) -> list[ServerConfig]:
        return [m.config for m in self.group.running]

    @property
    def client_config(self) -> ServerConfig:
        return self.group.running[0].client_config if self.group.running else super().client_config

    async def _start(self) -> None:
        await self.group.start()

    async def _stop(self, deadline: float | None) -> Sequence[StopReport | None]:
        return await self.group.stop(deadline)


def _host_dir(run_dir: Path | safefiles.Folder, i: int, hosts: int) -> Path | safefiles.Folder:
    """The near records' folder of host ``i``: the server folder itself for one host, else its
    ``host-i`` (inside the held folder when the caller holds it)."""
    if hosts == 1:
        return run_dir
    return run_dir.subfolder(f"host-{i}") if isinstance(run_dir, safefiles.Folder) else Path(run_dir) / f"host-{i}"


def ssh_fleet_factory(hosts: list[HostConfig], *, all_hosts: bool = False) -> FleetFactory:
    """A fleet of far servers, one per host: an SshFleet of one, an SshGroupFleet of several."""
    local_ports: dict[int, int] = {}
    where = ", ".join(h.label for h in hosts)

    def make(cfg: ServerConfig, *, run_dir: Path | safefiles.Folder, preflight: PreflightConfig | None = None,
             force: bool = False, on_preflight: OnPreflight | None = None,
             on_event: Listener | None = None) -> Fleet:
        # A relaunch reuses each host's local port (port_memo): the client keeps the URLs it was given.
        members = [RemoteServer(h, cfg, run_dir=_host_dir(run_dir, i, len(hosts)),
                                preflight=preflight, force=force, on_preflight=on_preflight,
                                port_memo=local_ports, port_key=i)
                   for i, h in enumerate(hosts)]
        if len(members) == 1:
            return SshFleet(members[0], where=where, on_event=on_event)
        where_dir = run_dir.path if isinstance(run_dir, safefiles.Folder) else Path(run_dir)
        group = ServerGroup(members, run_dir=where_dir, all_hosts=all_hosts, force=force)  # members tell on_preflight
        return SshGroupFleet(group, cfg, where=where, on_event=on_event)

    return make


__all__ = ["SshFleet", "SshGroupFleet", "ssh_fleet_factory"]
