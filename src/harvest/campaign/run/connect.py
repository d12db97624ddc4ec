"""The endpoints' check before any item: every endpoint answers and serves the configured model.

The session (``campaign/run/session.py``) calls :func:`check_endpoints` once its servers are up (or
for endpoints it does not manage), before dispatch. Every endpoint's ``/v1/models`` must answer and
list the configured model, within ``[client] start_deadline`` for all; an endpoint that cannot list
its models but answers ``/health`` or a first one-token request is up, and the model is checked by
that first answer. The run state's model is written here only. Nothing here sends an item.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from harvest.campaign.outputs.progress import Progress
from harvest.campaign.run.state import RunState
from harvest.client import Client
from harvest.client.startcheck import Listing
from harvest.config import HarvestConfig
from harvest.errors import ConfigError
from harvest.events import Event

log = logging.getLogger("harvest.campaign")


async def check_endpoints(state: RunState, client: Client, progress: Progress) -> bool:
    """Ask every endpoint what it serves before any item (:mod:`harvest.client.startcheck`),
    within ``[client] start_deadline`` for all: a listed model other than the configured one is
    refused with the list; an endpoint that cannot list its models but answers ``/health`` or a
    first one-token request is up, one warning says what ``/v1/models`` gave, and the model is
    checked by that first answer (the engine's 401/403/404 text refuses the job, no item
    charged). False (outcome "server_down") only when an endpoint refused connections or never
    answered within the deadline; False (outcome "stopped") at once when one answered with what is
    not HTTP (a wrong port); False (outcome "interrupted") on a stop asked meanwhile."""
    deadline = state.config.client.start_deadline
    progress.begin("connecting", deadline_s=deadline, endpoints=len(client.endpoints))
    requested, fallback, field = model_asked(state.config)

    def waiting(url: str, waited: float, got: str) -> None:
        progress.on_event(Event("connecting", "update", {"url": url, "waited_s": waited, "got": got}))

    asking = asyncio.create_task(client.start_check(requested or fallback, deadline, waiting))
    stop = asyncio.create_task(state.stop_requested.wait())
    await asyncio.wait({asking, stop}, return_when=asyncio.FIRST_COMPLETED)
    stop.cancel()
    if not asking.done():  # Ctrl-C while waiting for the endpoint to answer
        asking.cancel()
        await asyncio.gather(asking, return_exceptions=True)
        state.end("interrupted")
        progress.on_event(Event("connecting", "end", {}, ok=False))
        return False
    listings = asking.result()
    broken = [listing for listing in listings if listing.malformed is not None]
    if broken:
        said = "; ".join(f"{x.url}: GET /v1/models got {x.malformed}" for x in broken)
        state.end("stopped", f"{said}: this is not an OpenAI-compatible server (is the port of [server] base_url "
                             f"or [client] endpoints the server's?); nothing was sent, every item is still pending")
        progress.on_event(Event("connecting", "end", {"malformed": [x.url for x in broken]}, ok=False))
        return False
    silent = [listing for listing in listings if not listing.up]
    if silent:
        said = "; ".join(f"{x.url}: GET /v1/models {x.models_answer}" for x in silent)
        state.end("server_down", f"{', '.join(x.url for x in silent)} did not answer within [client] "
                                 f"start_deadline {deadline:g} s, neither GET /v1/models nor /health nor a first "
                                 f"request ({said}); nothing was sent, every item is still pending")
        progress.on_event(Event("connecting", "end", {"silent": [x.url for x in silent]}, ok=False))
        return False
    warnings = _judge(state.config, listings, progress, requested, fallback, field)
    listed = next((x.ids for x in listings if x.ids), ())
    if fallback is not None and listed and fallback not in listed:
        # A list without the model harvest launched the engine with: transformers serve lists
        # its Hugging Face cache, not the folder it serves, and refuses any other name (400).
        listed = (fallback,)
    model = requested or (listed[0] if listed else fallback if warnings else None)
    if model is not None:
        client.use_model(model)
    state.model = model
    info: dict[str, Any] = {"model": model}
    if warnings:
        info["warning"] = warnings[0] if len(warnings) == 1 else f"{warnings[0]} (+{len(warnings) - 1} more)"
    progress.on_event(Event("connecting", "end", info))
    return True


def _judge(cfg: HarvestConfig, listings: Sequence[Listing], progress: Progress, requested: str | None,
           fallback: str | None, field: str) -> list[str]:
    """Refuse the job (ConfigError) when an endpoint lists other models than the one asked for, or
    refused a first request for it; the warnings of endpoints that could not list theirs."""
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
    return warnings


def model_asked(config: HarvestConfig) -> tuple[str | None, str | None, str]:
    """The name every request asks for when configured (``served_model_name``, or ``model`` of
    an endpoint harvest does not manage), the name harvest passed to an engine it launched
    (asked for as configured where that engine cannot list its models; with a list, the first
    it lists is used), and the config field they come from."""
    server = config.server
    if server is None:
        return None, None, "model"
    field = "served_model_name" if server.served_model_name else "model"
    requested = server.requested_model
    fallback = str(server.model) if requested is None and server.launched and server.model else None
    return requested, fallback, field


__all__ = ["check_endpoints", "model_asked"]
