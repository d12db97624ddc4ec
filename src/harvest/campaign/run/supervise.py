"""The session's servers: launch, verified stop, relaunch of a dead or hung one.

:class:`Supervision`, one per session (``campaign/run/session.py``), given the run's state. A server
a killed earlier session left running is stopped first, by its record (the ledger's lock proves that
session is gone); then the job's server is launched (preflight -> launch -> ready) through the
placement chosen once for the run. A server that dies, or stays hung past ``[client] hang_deadline``
(requests in flight, nothing back, ``/health`` answering: ``harvest.client.hang``), is stopped
(verified) and launched again, at most ``run.max_relaunches`` times for the run, replacements a
placement made itself included; so is one neither healthy nor answering for ``hang_deadline`` (frozen
whole: ``/health`` silent too), rather than after ``health_deadline``. The endpoints' check before
any request is ``connect.py``'s. This
module never kills a process itself: the supervisor does, by its record.
"""

from __future__ import annotations

import logging
import time

from harvest.campaign.run.state import RunState
from harvest.client import Client, EndpointState
from harvest.client.endpoints import normalize_url
from harvest.client.hang import hung_line
from harvest.events import Event
from harvest.placement import FleetFactory, OnPreflight, Placement

log = logging.getLogger("harvest.campaign")


class Supervision:
    """The servers of one session: the only writer of the run state's fleet and relaunch count."""

    def __init__(self, state: RunState, placement: Placement, factory: FleetFactory, *, force: bool,
                 on_preflight: OnPreflight | None):
        self.state = state
        self.config = state.config
        self.placement = placement
        self.factory = factory
        self.force = force
        self.on_preflight = on_preflight

    async def start(self) -> None:
        """Launch the job's servers (preflight -> launch -> ready), when it names servers to launch."""
        cfg = self.config.server
        if cfg is None or not cfg.launched:
            return
        state = self.state
        fleet = self.factory(cfg, run_dir=state.server_dir(), preflight=self.config.preflight,
                             force=self.force, on_preflight=self.on_preflight, on_event=state.on_event)
        state.fleet = fleet
        await fleet.start()
        if state.timeline is not None:
            state.timeline.launch(fleet)

    def stop_leftover(self) -> None:
        """Stop, by their records, servers an earlier session of this run left running (that
        session was killed before its own stop). The ledger's lock proves that session is gone."""
        cfg = self.config.server
        if cfg is None or not cfg.launched:
            return
        self.state.stopped(self.placement.leftovers(self.state.server_dir()), leftover=True)

    async def stop(self, why: str | None = None) -> None:
        """The verified stop of the session's servers; ``why``: the reason of a stop before a
        relaunch (the timeline and the report keep it with the stop)."""
        fleet = self.state.fleet
        if fleet is None:
            return
        got = await fleet.stop()
        self.state.fleet = None
        self.state.stopped(got, why=why)  # one verified report per server, wherever it ran

    def exited(self) -> bool:
        """True when the session's servers run no more (one of them exited)."""
        fleet = self.state.fleet
        return fleet is not None and fleet.returncode() is not None

    async def relaunch(self, why: str) -> bool:
        """Verified stop of the dead (or hung) server, then a fresh launch; ``why`` is said in the
        log, on the panel's phase rows and in the timeline. False when out of relaunches: one
        budget for the run, shared with the replacements a placement made itself (Ray's)."""
        state, most = self.state, self.config.run.max_relaunches
        if state.fleet is None:
            return False
        spent = state.relaunches + state.fleet.replacements
        if spent >= most:
            if spent > state.relaunches:
                log.error("no relaunch: run.max_relaunches (%d) used up (%d by replacements)",
                          most, spent - state.relaunches)
            return False
        state.relaunches += 1
        log.warning("%s (relaunch %d of %d)", why, state.relaunches, most)
        state.notice("relaunched", f"{why} (relaunch {state.relaunches} of {most})")
        relaunch = {"relaunch": state.relaunches, "of": most, "why": why}
        state.phase(Event("generating", "end", {"outcome": "relaunching", **relaunch}, ok=False))
        await self.stop(why)
        state.phase(Event("stopping", "update", relaunch))
        await self.start()
        state.phase(Event("launching", "update", relaunch))
        state.phase(Event("generating", "start", relaunch))
        return True

    def hung(self, client: Client) -> str | None:
        """Why an endpoint of the managed server must be relaunched, once it has been for ``[client]
        hang_deadline``: hung (:mod:`harvest.client.hang`: ``hung: no answer for N s while /health
        answered``), or neither healthy nor answering (sick: a frozen engine, a paused container,
        ``/health`` silent too), which would otherwise wait out ``health_deadline``; else None."""
        fleet = self.state.fleet
        if fleet is None:
            return None
        managed = {normalize_url(url) for url in fleet.urls}
        now = time.monotonic()
        for e in client.stats().endpoints:
            if e.url not in managed or e.failing_since is None or now - e.failing_since < self.config.client.hang_deadline:
                continue
            if e.state is EndpointState.HUNG:
                return hung_line(e.quiet_s if e.quiet_s is not None else e.hung_s or 0.0)
            if e.state in (EndpointState.SICK, EndpointState.DOWN):
                what = e.last_error or "not healthy"
                return (f"{what}; not healthy for {now - e.failing_since:.0f} s (past [client] hang_deadline "
                        f"{self.config.client.hang_deadline:g} s)")
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


__all__ = ["Supervision"]
