"""The session's servers: launch, verified stop, relaunch of a dead one, and the endpoints' check.

Steps mixed into the session (``campaign/run/session.py``). A server a killed earlier session left running
is stopped first, by its record (the ledger's lock proves that session is gone); then the job's
server is launched (preflight -> launch -> ready) through the placement chosen once for the run;
before any request, every endpoint's ``/v1/models`` must answer and list the configured model. A
server that dies, or stays hung past ``[client] hang_deadline`` (requests in flight, nothing back,
``/health`` answering: ``harvest.client.hang``), is stopped (verified) and launched again, at most
``run.max_relaunches`` times for the run, replacements a placement made itself included. This
module never kills a process itself: the supervisor does, by its record.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harvest import safefiles
from harvest.campaign.outputs.progress import Progress
from harvest.campaign.outputs.timeline import Timeline
from harvest.client import Client, EndpointState
from harvest.client.endpoints import normalize_url
from harvest.client.hang import hung_line
from harvest.config import HarvestConfig
from harvest.errors import ConfigError
from harvest.events import Event, Listener
from harvest.placement import Fleet, FleetFactory, Placement
from harvest.stops import StopReport

log = logging.getLogger("harvest.campaign")

#: The run folder's subfolder that holds the server's records and logs.
SERVER_DIR = "server"


class ServerSteps:
    """The server steps of a session (``_Campaign`` in ``campaign/run/session.py`` sets the state)."""

    config: HarvestConfig
    run_dir: Path
    force: bool
    placement: Placement
    server_factory: FleetFactory
    on_preflight: Callable[[Any], None] | None  # Any: the launch's PreflightReport, shown as it is
    on_event: Listener | None
    stop_requested: asyncio.Event
    server: Fleet | None
    stop_reports: list[StopReport]
    relaunches: int
    outcome: str
    note: str | None
    timeline: Timeline | None
    model: str | None
    server_dir: Callable[[], safefiles.Folder]

    async def start_server(self) -> None:
        cfg = self.config.server
        if cfg is None or not cfg.launched:
            return
        server = self.server_factory(cfg, run_dir=self.server_dir(), preflight=self.config.preflight,
                                     force=self.force, on_preflight=self.on_preflight, on_event=self.on_event)
        self.server = server
        await server.start()
        if self.timeline is not None:
            self.timeline.launch(server)

    def stop_leftover(self) -> None:
        """Stop, by their records, servers an earlier session of this run left running (that
        session was killed before its own stop). The ledger's lock proves that session is gone."""
        cfg = self.config.server
        if cfg is None or not cfg.launched:
            return
        for report in self.placement.leftovers(self.server_dir()):
            self.stop_reports.append(report)
            if self.timeline is not None:
                self.timeline.stop(report, leftover=True)

    async def stop_server(self, why: str | None = None) -> None:
        """The verified stop of the session's servers; ``why``: the reason of a stop before a
        relaunch (the timeline and the report keep it with the stop)."""
        if self.server is None:
            return
        got = await self.server.stop()
        self.server = None
        for report in got:
            self.stop_reports.append(report)  # one verified report per server, wherever it ran
            if self.timeline is not None:
                self.timeline.stop(report, why=why)

    def server_exited(self) -> bool:
        return self.server is not None and self.server.returncode() is not None

    async def relaunch(self, why: str) -> bool:
        """Verified stop of the dead (or hung) server, then a fresh launch; ``why`` is said in the
        log, on the panel's phase rows and in the timeline. False when out of relaunches: one
        budget for the run, shared with the replacements a placement made itself (Ray's)."""
        if self.server is None:
            return False
        spent = self.relaunches + self.server.replacements
        if spent >= self.config.run.max_relaunches:
            if spent > self.relaunches:
                log.error("no relaunch: run.max_relaunches (%d) used up (%d by replacements)",
                          self.config.run.max_relaunches, spent - self.relaunches)
            return False
        self.relaunches += 1
        log.warning("%s (relaunch %d of %d)", why, self.relaunches, self.config.run.max_relaunches)
        relaunch = {"relaunch": self.relaunches, "of": self.config.run.max_relaunches, "why": why}
        self._phase(Event("generating", "end", {"outcome": "relaunching", **relaunch}, ok=False))
        await self.stop_server(why)
        self._phase(Event("stopping", "update", relaunch))
        await self.start_server()
        self._phase(Event("launching", "update", relaunch))
        self._phase(Event("generating", "start", relaunch))
        return True

    def _phase(self, event: Event) -> None:
        if self.on_event is not None:
            self.on_event(event)

    def hung_server(self, client: Client) -> str | None:
        """``hung: no answer for N s while /health answered`` when an endpoint of the managed server
        has been hung (:mod:`harvest.client.hang`) for ``[client] hang_deadline``; else None."""
        if self.server is None:
            return None
        managed = {normalize_url(url) for url in self.server.urls}
        now = time.monotonic()
        for e in client.stats().endpoints:
            if (e.url in managed and e.state is EndpointState.HUNG and e.failing_since is not None
                    and now - e.failing_since >= self.config.client.hang_deadline):
                return hung_line(e.quiet_s if e.quiet_s is not None else e.hung_s or 0.0)
        return None

    @staticmethod
    def down_reason(client: Client) -> str:
        """Why every endpoint is given up: the endpoints found hung named, with what to do."""
        reason = "every endpoint stayed down past [client] health_deadline"
        hung = [e for e in client.stats().endpoints if e.hung_s is not None]
        if hung:
            reason += "; " + "; ".join(f"{e.url} {e.last_error}" for e in hung)
            reason += " (restart the server, then run again to resume: every unfinished item is pending)"
        return reason

    async def _check_endpoints(self, client: Client, progress: Progress) -> bool:
        """Ask every endpoint what it serves before any item (:mod:`harvest.client.startcheck`),
        within ``[client] start_deadline`` for all: a listed model other than the configured one is
        refused with the list; an endpoint that cannot list its models but answers ``/health`` or a
        first one-token request is up, one warning says what ``/v1/models`` gave, and the model is
        checked by that first answer (the engine's 401/403/404 text refuses the job, no item
        charged). False (outcome "server_down") only when an endpoint refused connections or never
        answered within the deadline."""
        cfg = self.config
        deadline = cfg.client.start_deadline
        progress.begin("connecting", deadline_s=deadline, endpoints=len(client.endpoints))
        requested, fallback, field = self._model_asked()

        def waiting(url: str, waited: float, got: str) -> None:
            progress.on_event(Event("connecting", "update", {"url": url, "waited_s": waited, "got": got}))

        asking = asyncio.create_task(client.start_check(requested or fallback, deadline, waiting))
        stop = asyncio.create_task(self.stop_requested.wait())
        await asyncio.wait({asking, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not asking.done():  # Ctrl-C while waiting for the endpoint to answer
            asking.cancel()
            await asyncio.gather(asking, return_exceptions=True)
            self.outcome = "interrupted"
            progress.on_event(Event("connecting", "end", {}, ok=False))
            return False
        listings = asking.result()
        silent = [listing for listing in listings if not listing.up]
        if silent:
            self.outcome = "server_down"
            said = "; ".join(f"{x.url}: GET /v1/models {x.models_answer}" for x in silent)
            self.note = (f"{', '.join(x.url for x in silent)} did not answer within [client] start_deadline "
                         f"{deadline:g} s, neither GET /v1/models nor /health nor a first request ({said}); "
                         "nothing was sent, every item is still pending")
            progress.on_event(Event("connecting", "end", {"silent": [x.url for x in silent]}, ok=False))
            return False
        warnings = []
        for listing in listings:
            if listing.ids is not None:
                if requested is not None and listing.ids and requested not in listing.ids:
                    progress.on_event(Event("connecting", "end", {"refused": requested}, ok=False))
                    served_list = ", ".join(repr(i) for i in listing.ids)
                    raise ConfigError(cfg.source, [(f"{cfg.source} [server] {field}",
                                                    f"{requested!r} is not served by {listing.url}; "
                                                    f"it serves {served_list}")])
                continue
            first = listing.first
            asked = requested or fallback
            if first is not None and first.refused:
                progress.on_event(Event("connecting", "end", {"refused": asked}, ok=False))
                raise ConfigError(cfg.source, [(
                    f"{cfg.source} [server] {field}",
                    f"{listing.url} cannot list its models (GET /v1/models {listing.models_answer}) and "
                    f"refused a first request for {asked!r} with HTTP {first.status}: {first.message}; "
                    "nothing was sent, every item is still pending")])
            warning = listing.warning(asked)
            if warning and first is not None and first.status is not None and first.status >= 300:
                warning += f"; a first request answered {first.status}: {first.message}"
            if warning:
                log.warning("%s", warning)
                warnings.append(warning)
        listed = next((x.ids for x in listings if x.ids), ())
        if fallback is not None and listed and fallback not in listed:
            # A list without the model harvest launched the engine with: transformers serve lists
            # its Hugging Face cache, not the folder it serves, and refuses any other name (400).
            listed = (fallback,)
        model = requested or (listed[0] if listed else fallback if warnings else None)
        if model is not None:
            client.use_model(model)
        self.model = model
        info: dict[str, Any] = {"model": model}
        if warnings:
            info["warning"] = warnings[0] if len(warnings) == 1 else f"{warnings[0]} (+{len(warnings) - 1} more)"
        progress.on_event(Event("connecting", "end", info))
        return True

    def _model_asked(self) -> tuple[str | None, str | None, str]:
        """The name every request asks for when configured (``served_model_name``, or ``model`` of
        an endpoint harvest does not manage), the name harvest passed to an engine it launched
        (asked for as configured where that engine cannot list its models; with a list, the first
        it lists is used), and the config field they come from."""
        server = self.config.server
        if server is None:
            return None, None, "model"
        field = "served_model_name" if server.served_model_name else "model"
        requested = server.requested_model
        fallback = str(server.model) if requested is None and server.launched and server.model else None
        return requested, fallback, field


__all__ = ["SERVER_DIR", "ServerSteps"]
