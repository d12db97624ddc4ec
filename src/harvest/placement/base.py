"""What every placement kind offers, and the one shape the campaign sees of a launch: a Fleet.

    placement = from_config(cfg, flags)     # harvest.placement: local, ssh or ray, chosen once
    placement.gpus(); placement.preflight(cfg, ...); placement.ps(show_all)
    make = placement.fleet()                # a factory: make(server_cfg, run_dir=..., ...) -> Fleet
    fleet = make(cfg.server, run_dir=...); await fleet.start(); fleet.urls; await fleet.stop()
    placement.stop(run_dir)                 # from a run folder's record: one StopReport per server

A Fleet wraps whatever a kind launches (one supervised Server here, a far server through its
tunnel, one per ``[[hosts]]`` entry, the actors of a Ray run) and answers the same questions for all
of them: the endpoints, readiness, KV capacity, the engine adapter, and a stop that returns one
verified :class:`~harvest.server.StopReport` per server (a list, always). This module imports no
kind: kinds import it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

from harvest.config import HarvestConfig, HostConfig, ServerConfig
from harvest.errors import ConfigError
from harvest.events import Listener, emit
from harvest.server import StopReport
from harvest.server.stop import DEFAULT_MARGIN_MIB, StopStep
from harvest.server.base import adapter_for


class Refused(ConfigError):
    """A command cannot work on this placement: one line, exit 2 (never a silent fallback here)."""

    def __init__(self, where: str, message: str):
        self.source = where
        self.problems = [(where, message)]
        Exception.__init__(self, f"{where}: {message}")


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
    """Readiness as measured where the server runs (the far harvest, an actor's supervisor)."""

    seconds: float


@dataclass(frozen=True)
class Answer:
    """One place's answer to a probe (``gpus``, ``preflight``): its JSON document, or why there is none."""

    label: str
    doc: dict[str, Any] | None
    error: str | None = None
    extra: dict[str, Any] | None = None


class Placement(ABC):
    """Where servers run; every command asks it instead of deciding itself. ``local``, ``ssh`` and
    ``ray`` subclass it (``KINDS`` in :mod:`harvest.placement`), each with the whole verb set."""

    kind: ClassVar[str]

    @abstractmethod
    def where(self) -> str:
        """A few words for messages: ``this machine``, ``box (ssh)``, ``the Ray cluster at auto``."""

    @abstractmethod
    def gpus(self) -> Any:
        """What the GPUs and hosts hold now (a result the CLI renders, with ``to_json``)."""

    def gpus_json(self, got: Any) -> dict[str, Any]:
        """One live snapshot of this machine as ``harvest.gpus/2`` (``gpus --watch --json``): only a
        placement that is this machine has one."""
        raise Refused("--watch", f"a live view is of this machine; {self.where()} is shown once")

    @abstractmethod
    def preflight(self, cfg: HarvestConfig, *, output_dir: Path | None = None, wait_s: float | None = None,
                  on_wait: Callable[[], None] | None = None) -> Any:
        """The [server] of ``cfg`` checked where it would run (a result with ``passed`` and ``to_json``);
        ``wait_s``: re-check until every rule passes or it runs out, ``on_wait`` told once first."""

    @abstractmethod
    def fleet(self, *, probe: bool = False, all_hosts: bool = False) -> Any:
        """A factory of Fleets; ``probe``: one server (tune / compare measure one)."""

    @abstractmethod
    def server(self, cfg: ServerConfig, *, run_dir: Path, **kw: Any) -> Fleet:
        """One server (``harvest serve``) placed here, as a Fleet."""

    def note(self, probe: bool) -> str | None:
        """Why a probe (tune, compare) uses fewer servers than the job would, if it does."""
        return None

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
    def leftovers(self, server_dir: Path) -> list[StopReport]:
        """Stop what an earlier (killed) session of a run left running, by that run's records."""


class Fleet:
    """The servers of one launch, wherever they run; the one shape run / tune / compare / serve use.

    ``inner`` is what the kind launched (it keeps its own lifecycle and records); ``emits``: the
    fleet reports the launching and stopping phases itself (far and Ray servers, whose phases happen
    out of reach of ``on_event``); a local Server reports its own.
    """

    def __init__(self, inner: Any, config: ServerConfig, *, where: str, on_event: Listener | None = None,
                 emits: bool = True):
        self.inner = inner
        self.config = config
        self.where = where
        self.on_event = on_event
        self.emits = emits
        self.stop_reports: list[StopReport] = []

    def __getattr__(self, name: str) -> Any:  # what only one kind has (state(), detach(), tunnel, ...)
        return getattr(self.inner, name)

    @property
    def run_dir(self) -> Path:
        return Path(self.inner.run_dir)

    @property
    def urls(self) -> list[str]:
        return list(getattr(self.inner, "urls", None) or [self.inner.url])

    @property
    def url(self) -> str:
        return self.urls[0]

    @property
    def server_configs(self) -> list[ServerConfig]:
        """The settings each server was launched with, one per URL in order: a ``[[hosts]]`` entry's
        own where it overrides [server] (its batch limit sets where auto concurrency starts and stops)."""
        members = getattr(self.inner, "running", None)
        if members:
            return [m.config for m in members]
        own = getattr(self.inner, "config", None)
        return [own if isinstance(own, ServerConfig) else self.config] * len(self.urls)

    @property
    def ready(self) -> Any:
        return self.inner.ready

    @property
    def kv_capacity_tokens(self) -> int | None:
        return self.inner.kv_capacity_tokens

    @property
    def adapter(self) -> Any:
        """The engine adapter of the servers' kind (their metric names, for probes from here)."""
        return adapter_for(self.config.engine)

    @property
    def client_config(self) -> ServerConfig:
        """[server] as this machine reaches the first server (a tunnel's local end, a node's address)."""
        got = getattr(self.inner, "client_config", None)
        if isinstance(got, ServerConfig):
            return got
        members = getattr(self.inner, "running", None)
        if members:
            return members[0].client_config
        if isinstance(getattr(self.inner, "config", None), ServerConfig) and not getattr(self.inner, "urls", None):
            return self.inner.config
        parts = urlsplit(self.url)
        return self.config.model_copy(update={"host": parts.hostname or self.config.host,
                                              "port": parts.port or self.config.port})

    @property
    def stop_report(self) -> StopReport | None:
        """The stop's report when one server was stopped; of several, the first dirty one."""
        dirty = [r for r in self.stop_reports if not r.clean]
        if dirty or self.stop_reports:
            return (dirty or self.stop_reports)[0]
        return getattr(self.inner, "stop_report", None)

    def placed(self) -> list[dict[str, Any]]:
        """Where each server runs: ``where`` (this machine, a host, a node), ``pid`` there, ``url``."""
        placed = getattr(self.inner, "placed", None)
        if placed is not None:
            return list(placed())
        return [{"where": self.where, "pid": getattr(self.inner, "pid", None), "url": self.url}]

    @property
    def replacements(self) -> int:
        """Servers the placement itself replaced so far (a Ray run's lost actors): they spend the same
        ``[run] max_relaunches`` as the campaign's relaunches."""
        return int(getattr(self.inner, "replacements", 0))

    def listen(self, on_event: Listener | None) -> None:
        """Report the phases from now on to ``on_event`` (the fleet's and the servers' own)."""
        self.on_event = on_event
        if hasattr(self.inner, "on_event"):
            self.inner.on_event = on_event

    def returncode(self) -> int | None:
        return self.inner.returncode()

    def cancel(self) -> None:
        self.inner.cancel()

    async def start(self) -> Fleet:
        if self.emits:
            emit(self.on_event, "launching", "start", engine=self.config.engine, where=self.where,
                 url=self.config.url)
        try:
            await self.inner.start()
        except BaseException as exc:
            if self.emits:
                emit(self.on_event, "launching", "end", ok=False, engine=self.config.engine, where=self.where,
                     reason=(str(exc).splitlines() or [type(exc).__name__])[0][:200])
            self._collect(getattr(self.inner, "stop_report", None))
            raise
        if self.emits:
            ready = self.inner.ready
            emit(self.on_event, "launching", "end", engine=self.config.engine, where=self.where,
                 seconds=ready.seconds if ready is not None else 0.0, kv_capacity_tokens=self.kv_capacity_tokens,
                 urls=self.urls)
        return self

    async def stop(self, deadline: float | None = None) -> list[StopReport]:
        """Every server's verified stop; one report each (none for a server that never started)."""
        if self.emits:
            emit(self.on_event, "stopping", "start")
        got = await self.inner.stop(deadline) if deadline is not None else await self.inner.stop()
        self._collect(got)
        if self.emits:
            clean = all(r.clean for r in self.stop_reports)
            emit(self.on_event, "stopping", "end", ok=clean, verdict="clean" if clean else "dirty",
                 seconds=max((r.total_s for r in self.stop_reports), default=0.0))
        return list(self.stop_reports)

    def _collect(self, got: Any) -> None:
        for r in got if isinstance(got, list) else [got]:
            if r is not None and all(r is not s for s in self.stop_reports):
                self.stop_reports.append(r)


def fleet_factory(make: Any, *, where: str, emits: bool = True) -> Any:
    """Wrap a kind's server factory so that every launch is a Fleet (``on_event`` reaches it)."""

    def factory(cfg: ServerConfig, *, run_dir: Path, preflight: Any = None, force: bool = False,
                on_preflight: Any = None, on_event: Listener | None = None, **kw: Any) -> Fleet:
        inner = make(cfg, run_dir=Path(run_dir), preflight=preflight, force=force, on_preflight=on_preflight,
                     on_event=on_event, **kw)
        return Fleet(inner, cfg, where=where, on_event=on_event, emits=emits)

    return factory


__all__ = ["Answer", "Flags", "Fleet", "Placement", "Readiness", "Refused", "fleet_factory"]
