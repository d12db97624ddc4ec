"""The session's servers: launch, verified stop, relaunch of a dead one, and the endpoints' check.

Steps mixed into the session (``campaign/run.py``). A server a killed earlier session left running
is stopped first, by its record (the ledger's lock proves that session is gone); then the job's
server is launched (preflight -> launch -> ready) through the placement chosen once for the run;
before any request, every endpoint's ``/v1/models`` must answer and list the configured model. A
server that dies is stopped (verified) and launched again, at most ``run.max_relaunches`` times
for the run, replacements a placement made itself included. This module never kills a process
itself: the supervisor does, by its record.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from harvest.campaign.progress import Progress
from harvest.campaign.timeline import Timeline
from harvest.client import Client
from harvest.config import HarvestConfig
from harvest.errors import ConfigError
from harvest.events import Event
from harvest.server import StopReport

log = logging.getLogger("harvest.campaign")

#: The run folder's subfolder that holds the server's records and logs.
SERVER_DIR = "server"


class ServerSteps:
    """The server steps of a session (``_Campaign`` in ``campaign/run.py`` sets the state)."""

    config: HarvestConfig
    run_dir: Path
    force: bool
    placement: Any
    server_factory: Any
    on_preflight: Any
    on_event: Any
    stop_requested: asyncio.Event
    server: Any
    stop_reports: list[StopReport]
    relaunches: int
    outcome: str
    note: str | None
    timeline: Timeline | None
    model: str | None

    async def start_server(self) -> None:
        cfg = self.config.server
        if cfg is None or not cfg.launched:
            return
        server = self.server_factory(cfg, run_dir=self.run_dir / SERVER_DIR, preflight=self.config.preflight,
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
        for report in self.placement.leftovers(self.run_dir / SERVER_DIR):
            self.stop_reports.append(report)
            if self.timeline is not None:
                self.timeline.stop(report, leftover=True)

    async def stop_server(self) -> None:
        if self.server is None:
            return
        got = await self.server.stop()
        self.server = None
        for report in got if isinstance(got, list) else [got] if got is not None else []:
            self.stop_reports.append(report)  # one verified report per server, wherever it ran
            if self.timeline is not None:
                self.timeline.stop(report)

    def server_exited(self) -> bool:
        return self.server is not None and self.server.returncode() is not None

    async def relaunch(self) -> bool:
        """Verified stop of the dead server, then a fresh launch. False when out of relaunches: one
        budget for the run, shared with the replacements a placement made itself (Ray's)."""
        spent = self.relaunches + (getattr(self.server, "replacements", 0) if self.server is not None else 0)
        if self.server is None or spent >= self.config.run.max_relaunches:
            if self.server is not None and spent > self.relaunches:
                log.error("no relaunch: run.max_relaunches (%d) used up (%d by replacements)",
                          self.config.run.max_relaunches, spent - self.relaunches)
            return False
        self.relaunches += 1
        log.warning("the server exited (code %s); relaunch %d of %d", self.server.returncode(), self.relaunches,
                    self.config.run.max_relaunches)
        await self.stop_server()
        await self.start_server()
        return True

    async def _check_endpoints(self, client: Client, progress: Progress) -> bool:
        """Ask every endpoint's ``/v1/models`` (an endpoint harvest does not manage gets ``[client]
        start_deadline`` to answer) and send the configured model: one not listed is refused with
        the list. False (outcome "server_down") when an endpoint never answered."""
        cfg = self.config
        deadline = cfg.client.start_deadline
        progress.begin("connecting", deadline_s=deadline, endpoints=len(client.endpoints))

        def waiting(url: str, waited: float) -> None:
            progress.on_event(Event("connecting", "update", {"url": url, "waited_s": waited}))

        asking = asyncio.create_task(client.served_models(deadline, waiting))
        stop = asyncio.create_task(self.stop_requested.wait())
        await asyncio.wait({asking, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not asking.done():  # Ctrl-C while waiting for the endpoint to answer
            asking.cancel()
            await asyncio.gather(asking, return_exceptions=True)
            self.outcome = "interrupted"
            progress.on_event(Event("connecting", "end", {}, ok=False))
            return False
        served = asking.result()
        silent = [url for url, ids in served.items() if ids is None]
        if silent:
            self.outcome = "server_down"
            self.note = (f"{', '.join(silent)} did not answer GET /v1/models within [client] start_deadline "
                         f"{deadline:g} s; nothing was sent, every item is still pending")
            progress.on_event(Event("connecting", "end", {"silent": silent}, ok=False))
            return False
        requested = cfg.server.requested_model if cfg.server is not None else None
        field = "served_model_name" if cfg.server is not None and cfg.server.served_model_name else "model"
        for url, ids in served.items():
            if requested is not None and ids and requested not in ids:
                progress.on_event(Event("connecting", "end", {"refused": requested}, ok=False))
                served_list = ", ".join(repr(i) for i in ids)
                raise ConfigError(cfg.source, [(f"{cfg.source} [server] {field}",
                                                f"{requested!r} is not served by {url}; it serves {served_list}")])
        listed = next((ids for ids in served.values() if ids), [])
        model = requested or (listed[0] if listed else None)
        if model is not None:
            client.use_model(model)
        self.model = model
        progress.on_event(Event("connecting", "end", {"model": model}))
        return True


__all__ = ["SERVER_DIR", "ServerSteps"]
