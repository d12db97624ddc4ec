"""What every placement kind offers, and the one shape the campaign sees of a launch: a Fleet.

    placement = from_config(cfg, flags)     # harvest.placement: local, ssh or ray, chosen once
    placement.gpus(); placement.preflight(cfg, ...); placement.ps(show_all)
    make = placement.fleet()                # a factory: make(server_cfg, run_dir=..., ...) -> Fleet
    fleet = make(cfg.server, run_dir=...); await fleet.start(); fleet.urls; await fleet.stop()
    placement.stop(run_dir)                 # from a run folder's record: one StopReport per server

Both are abstract base classes that each kind subclasses with the whole verb set; what only one
kind can do has a default here (a no-op, or a :class:`Refused` naming the placement), so a caller
never asks an object what it is. A Fleet wraps whatever a kind launches (one supervised Server
here, a far server through its tunnel, one per ``[[hosts]]`` entry, the actors of a Ray run) and
answers the same questions for all of them: the endpoints, readiness, KV capacity, the engine
adapter and limits, and a stop that returns one verified :class:`~harvest.stops.StopReport` per
server (a list, always). This module imports no kind: kinds import it.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol
from urllib.parse import urlsplit

from harvest import safefiles
from harvest.checks import PreflightReport
from harvest.client.engine import EngineLimit
from harvest.config import HarvestConfig, HostConfig, PreflightConfig, ServerConfig
from harvest.errors import ConfigError
from harvest.events import Listener, emit
from harvest.placement import record
from harvest.placement.base_results import Answer, GpusByPlace, PreflightByPlace
from harvest.server import (
    EngineAdapter,
    LaunchRecord,
    adapter_for,
    batch_limit,
    batch_limit_exact,
    has_metrics,
)
from harvest.stops import DEFAULT_MARGIN_MIB, StopReport, StopStep

if TYPE_CHECKING:
    from harvest.client import Client


class Refused(ConfigError):
    """A command cannot work on this placement: one line, exit 2 (never a silent fallback here).
    Its one problem is ``(where, message)``; its text ``where: message``."""

    def __init__(self, where: str, message: str):
        super().__init__(where, [(where, message)], message=f"{where}: {message}")


class NothingToStop(Refused):
    """A stop found no server to stop: a folder without a launch record, or nothing running. Its
    message starts "nothing to stop: "; ``harvest stop`` says it and exits 0 (a cleanup script may
    stop twice)."""


@dataclass(frozen=True)
class Flags:
    """What the command line says about where: ``--host`` and its flags, ``--cluster [ADDRESS]``."""

    host: HostConfig | None = None
    cluster: str | None = None
    #: ``--timeout`` of the cluster probes (connection and each node's answer).
    timeout: float | None = None


@dataclass(frozen=True)
class Readiness:
    """Readiness as measured where the server runs (the supervisor here, the far harvest, an actor's)."""

    seconds: float


#: What a launch tells of its preflight, before it launches: the report of every rule (a far
#: host's or a node's read back into the same record), for the command to show.
OnPreflight = Callable[[PreflightReport], None]


class OneServer(Protocol):
    """What a fleet of one server launches and stops: a supervised Server here, a far server
    (:class:`~harvest.placement.ssh.servers.RemoteServer`) elsewhere."""

    @property
    def stop_report(self) -> StopReport | None:
        """The verified stop of what the launch started, once there was one (a failed launch's too)."""

    async def start(self) -> object: ...

    async def stop(self, deadline: float | None = None) -> StopReport | None: ...


def engine_limit(server: ServerConfig) -> EngineLimit:
    """What the client may know of an engine launched with ``server``'s settings, for ``concurrency =
    "auto"``: its batch limit, whether that is its hard cap, whether it has /metrics."""
    return EngineLimit(batch_limit(server), batch_limit_exact(server), has_metrics(server))


class Fleet(ABC):
    """The servers of one launch, wherever they run; the one shape run / tune / compare / serve use.

    A kind answers the live questions (``urls``, ``ready``, ``kv_capacity_tokens``, ``returncode``,
    ``cancel``) of what it wraps. The launch (``_start``) and the verified stop (``_stop``) are
    here for a fleet of one server (``server``: a :class:`OneServer`); a fleet of several overrides
    both. :meth:`start` and :meth:`stop` report the phases around them (``emits``) and keep one
    StopReport per server. Everything else has a default a kind overrides where it knows better.
    """

    #: The fleet reports the launching and stopping phases itself (far and Ray servers, whose
    #: phases happen out of reach of ``on_event``); a local Server reports its own.
    emits: ClassVar[bool] = True

    def __init__(self, config: ServerConfig, *, run_dir: Path, where: str, on_event: Listener | None = None,
                 server: OneServer | None = None):
        self.config = config
        self.run_dir = Path(run_dir)
        self.where = where
        self.on_event = on_event
        self.stop_reports: list[StopReport] = []
        #: The one server this fleet launches and stops (None: a fleet of several, with its own
        #: ``_start`` and ``_stop``).
        self._one = server

    # --- what a kind implements ------------------------------------------------------------------

    @property
    @abstractmethod
    def urls(self) -> list[str]:
        """Every server's endpoint as this machine reaches it, in order."""

    @property
    @abstractmethod
    def ready(self) -> Readiness | None:
        """How readiness went (None until every server is ready)."""

    @property
    @abstractmethod
    def kv_capacity_tokens(self) -> int | None:
        """The smallest KV capacity the servers reported (None: none did)."""

    @abstractmethod
    def returncode(self) -> int | None:
        """None while the servers serve; else the code they ended with (-1: gone, code unknown)."""

    @abstractmethod
    def cancel(self) -> None:
        """Ask a launch in progress to give up (its cleanup stops what it started). Signal-handler safe."""

    # --- the launch and the stop of one server (a fleet of several overrides both) ---------------

    def _server(self) -> OneServer:
        if self._one is None:
            raise NotImplementedError(f"{type(self).__name__} launches several servers: it implements "
                                      "_start and _stop itself")
        return self._one

    async def _start(self) -> None:
        """Launch every server until ready; on failure, what was stopped is in ``stop_reports``."""
        server = self._server()
        try:
            await server.start()
        except BaseException:
            self.collect([server.stop_report])
            raise

    async def _stop(self, deadline: float | None) -> Sequence[StopReport | None]:
        """Every server's verified stop (idempotent)."""
        return [await self._server().stop(deadline)]

    # --- what every fleet answers ----------------------------------------------------------------

    @property
    def url(self) -> str:
        return self.urls[0]

    @property
    def server_configs(self) -> list[ServerConfig]:
        """The settings each server was launched with, one per URL in order: a ``[[hosts]]`` entry's
        own where it overrides [server] (its batch limit sets where auto concurrency starts and stops)."""
        return [self.config] * len(self.urls)

    def engine_limits(self) -> list[EngineLimit]:
        """What the client may know of each server's engine, one per URL (``concurrency = "auto"``)."""
        return [engine_limit(c) for c in self.server_configs]

    @property
    def client_config(self) -> ServerConfig:
        """[server] as this machine reaches the first server (a tunnel's local end, a node's address)."""
        parts = urlsplit(self.url)
        return self.config.model_copy(update={"host": parts.hostname or self.config.host,
                                              "port": parts.port or self.config.port})

    @property
    def adapter(self) -> EngineAdapter:
        """The engine adapter of the servers' kind (their metric names, for probes from here)."""
        return adapter_for(self.config.engine)

    def placed(self) -> list[dict[str, Any]]:  # Any: JSON values (harvest.serve/2 "servers" rows)
        """Where each server runs: ``where`` (this machine, a host, a node), ``pid`` there, ``url``."""
        return [{"where": self.where, "pid": None, "url": self.url}]

    @property
    def replacements(self) -> int:
        """Servers the placement itself replaced so far (a Ray run's lost actors): they spend the same
        ``[run] max_relaunches`` as the campaign's relaunches. None here."""
        return 0

    def attach(self, client: Client) -> None:
        """The client whose endpoints should follow servers the placement replaces by itself (Ray's);
        nothing to do where servers are only relaunched by the campaign."""

    def launch_record(self) -> LaunchRecord | None:
        """The supervisor's launch record, where it is on this machine (None elsewhere)."""
        return None

    def stopped_elsewhere(self) -> bool:
        """True once another process's ``harvest stop`` is stopping or stopped the servers (known
        only where their record is on this machine)."""
        return False

    def detach(self) -> None:
        """Leave the servers running (``harvest serve --detach``); ``harvest stop RUN_DIR`` stops them."""
        raise Refused("--detach", f"the servers on {self.where} cannot be left running by this command")

    def listen(self, on_event: Listener | None) -> None:
        """Report the phases from now on to ``on_event`` (the fleet's and the servers' own)."""
        self.on_event = on_event

    @property
    def stop_report(self) -> StopReport | None:
        """The stop's report when one server was stopped; of several, the first dirty one."""
        dirty = [r for r in self.stop_reports if not r.clean]
        shown = dirty or self.stop_reports
        return shown[0] if shown else None

    async def start(self) -> Fleet:
        if self.emits:
            emit(self.on_event, "launching", "start", engine=self.config.engine, where=self.where,
                 url=self.config.url)
        try:
            await self._start()
        except BaseException as exc:
            if self.emits:
                emit(self.on_event, "launching", "end", ok=False, engine=self.config.engine, where=self.where,
                     reason=(str(exc).splitlines() or [type(exc).__name__])[0][:200])
            raise
        if self.emits:
            ready = self.ready
            emit(self.on_event, "launching", "end", engine=self.config.engine, where=self.where,
                 seconds=ready.seconds if ready is not None else 0.0, kv_capacity_tokens=self.kv_capacity_tokens,
                 urls=self.urls)
        return self

    async def stop(self, deadline: float | None = None) -> list[StopReport]:
        """Every server's verified stop; one report each (none for a server that never started)."""
        if self.emits:
            emit(self.on_event, "stopping", "start")
        self.collect(await self._stop(deadline))
        if self.emits:
            clean = all(r.clean for r in self.stop_reports)
            emit(self.on_event, "stopping", "end", ok=clean, verdict="clean" if clean else "dirty",
                 seconds=max((r.total_s for r in self.stop_reports), default=0.0))
        return list(self.stop_reports)

    def collect(self, reports: Sequence[StopReport | None]) -> None:
        """Keep these stop reports (each once)."""
        for r in reports:
            if r is not None and all(r is not s for s in self.stop_reports):
                self.stop_reports.append(r)


class FarServers(Protocol):
    """What a far kind's launcher answers of its servers (an SSH host's server, the servers of
    ``[[hosts]]``, a Ray run's actors): the live questions a :class:`FarFleet` passes on."""

    @property
    def urls(self) -> list[str]: ...

    @property
    def ready(self) -> Readiness | None: ...

    @property
    def kv_capacity_tokens(self) -> int | None: ...

    def placed(self) -> list[dict[str, Any]]: ...  # Any: JSON values (harvest.serve/2 "servers" rows)

    def returncode(self) -> int | None: ...

    def cancel(self) -> None: ...


class FarFleet(Fleet):
    """A fleet whose servers run elsewhere, reached and answered for by one launcher of the kind
    (``servers``); a kind adds its launch and its stop, and what it alone can do."""

    def __init__(self, servers: FarServers, config: ServerConfig, *, run_dir: Path, where: str,
                 on_event: Listener | None = None, server: OneServer | None = None):
        super().__init__(config, run_dir=run_dir, where=where, on_event=on_event, server=server)
        self.servers = servers

    @property
    def urls(self) -> list[str]:
        return self.servers.urls

    @property
    def ready(self) -> Readiness | None:
        return self.servers.ready

    @property
    def kv_capacity_tokens(self) -> int | None:
        return self.servers.kv_capacity_tokens

    def placed(self) -> list[dict[str, Any]]:
        return self.servers.placed()

    def returncode(self) -> int | None:
        return self.servers.returncode()

    def cancel(self) -> None:
        self.servers.cancel()


class FleetFactory(Protocol):
    """What a placement's :meth:`Placement.fleet` returns: one call, one launch's Fleet."""

    def __call__(self, cfg: ServerConfig, *, run_dir: Path | safefiles.Folder, preflight: PreflightConfig | None = None,
                 force: bool = False, on_preflight: OnPreflight | None = None,
                 on_event: Listener | None = None) -> Fleet:
        """``run_dir``: the servers' records folder, by name or held by the caller (a campaign's
        ``server/``: every record, log and stop report then goes through its descriptor);
        ``on_preflight`` is told each launch's preflight report."""
        ...


class Placement(ABC):
    """Where servers run; every command asks it instead of deciding itself. ``local``, ``ssh`` and
    ``ray`` subclass it (``KINDS`` in :mod:`harvest.placement`), each with the whole verb set."""

    kind: ClassVar[str]
    #: The servers run on this machine, supervised by this process (their records are its own);
    #: False where a far harvest or a node's actor supervises them.
    here: ClassVar[bool] = False

    @abstractmethod
    def where(self) -> str:
        """A few words for messages: ``this machine``, ``box (ssh)``, ``the Ray cluster at auto``."""

    @abstractmethod
    def gpus(self) -> GpusByPlace:
        """What the GPUs and hosts hold now, one answer per place."""

    def gpus_live(self) -> contextlib.AbstractContextManager[Callable[[], GpusByPlace]]:
        """``gpus --watch``: a measuring function to call again and again (one GPU probe held open);
        only a placement that is this machine has one."""
        raise Refused("--watch", f"--watch refreshes this machine's view; {self.where()} is shown once")

    @abstractmethod
    def preflight(self, cfg: HarvestConfig, *, output_dir: Path | None = None, wait_s: float | None = None,
                  on_wait: Callable[[], None] | None = None) -> PreflightByPlace:
        """The [server] of ``cfg`` checked where it would run, one answer per place; ``wait_s``:
        re-check until every rule passes or it runs out, ``on_wait`` told once first."""

    @abstractmethod
    def fleet(self, *, probe: bool = False, all_hosts: bool = False) -> FleetFactory:
        """A factory of Fleets; ``probe``: one server (tune / compare measure one)."""

    def server(self, cfg: ServerConfig, *, run_dir: Path, preflight: PreflightConfig | None = None,
               force: bool = False, on_preflight: OnPreflight | None = None,
               on_event: Listener | None = None) -> Fleet:
        """The servers of one ``harvest serve`` placed here, as a Fleet (the factory's keywords)."""
        return self.fleet()(cfg, run_dir=run_dir, preflight=preflight, force=force, on_preflight=on_preflight,
                            on_event=on_event)

    def note(self, probe: bool) -> str | None:
        """Why a probe (tune, compare) uses fewer servers than the job would, if it does."""
        return None

    def hold_state_dir(self) -> None:
        """Refuse, before anything is written, a state dir this machine's launches could not use
        (another user's); nothing to check where the servers' records are kept elsewhere."""

    def check_records(self, server_dir: Path | safefiles.Folder, server: ServerConfig) -> None:
        """Refuse (:class:`~harvest.errors.UnsafePathError`), before anything is launched, a run's
        server folder whose records a launch of ``server`` would be refused to write once it started
        something: here, the near placement record."""
        record.check(server_dir)

    @abstractmethod
    def ps(self, show_all: bool) -> list[dict[str, Any]]:
        """Servers harvest started there: ``harvest.ps/1`` rows, each with ``where``."""

    @abstractmethod
    def stop(self, run_dir: Path | None, *, deadline: float | None = None, grace: float | None = None,
             margin_mib: int = DEFAULT_MARGIN_MIB,
             on_step: Callable[[str, StopStep | None], None] | None = None) -> list[StopReport]:
        """Stop a run's servers by its record (``run_dir``), each verified where it runs (``grace``,
        ``margin_mib`` and ``on_step``, each step as it happens, where the stop runs here)."""

    @abstractmethod
    def leftovers(self, server_dir: Path | safefiles.Folder) -> list[StopReport]:
        """Stop what an earlier (killed) session of a run left running, by that run's records."""


__all__ = ["Answer", "FarFleet", "FarServers", "Flags", "Fleet", "FleetFactory", "NothingToStop", "OnPreflight",
           "OneServer", "Placement", "Readiness", "Refused", "engine_limit"]
