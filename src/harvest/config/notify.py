"""``[notify]``: who is told, at once, when a run ends, stalls, relaunches its server or trips its
breaker: a command (argv, no shell: the document on its stdin) and/or a URL (the document POSTed as
JSON). The document is ``harvest.notify/1`` (docs/notify.md); sending it is
``campaign/run/notify.py``'s.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from harvest.config.base import StrictModel

#: What a run tells: its end, finished (every item accounted for, within the limits) or otherwise
#: (interrupted, server down, stopped, too many failed); nothing coming back from its servers
#: (stalled: a hang, a frozen engine); its managed server relaunched; its breaker tripped.
NotifyEvent = Literal["finished", "ended", "stalled", "relaunched", "breaker"]
NOTIFY_EVENTS: tuple[NotifyEvent, ...] = ("finished", "ended", "stalled", "relaunched", "breaker")


class NotifyConfig(StrictModel):
    """Who is told when a run ends, stalls, relaunches its server or trips its breaker."""

    command: list[str] = Field(default_factory=list, description="a command run for each event, as argv (no "
                               "shell): the JSON document (harvest.notify/1, docs/notify.md) on its stdin, the "
                               "event in $HARVEST_NOTIFY_EVENT; e.g. [\"notify-send\", \"harvest\"] or a script")
    url: str | None = Field(None, description="an http(s) URL the JSON document is POSTed to for each event "
                            "(a chat webhook, an alert gateway); it is recorded with its path and query hidden")
    on: list[NotifyEvent] = Field(default_factory=lambda: list(NOTIFY_EVENTS), description="the events told: "
                                  "finished (every item accounted for), ended (any other end: interrupted, "
                                  "server down, stopped, too many failed), stalled (nothing comes back: a hung "
                                  "or frozen server, told once per spell), relaunched (the managed server), "
                                  "breaker (the circuit breaker stopped the run)")
    timeout: float = Field(10.0, gt=0, le=300, description="seconds one command or POST may take; past it the "
                           "command (its process group) is killed; a failure is logged and never ends or "
                           "slows the run")

    @field_validator("url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        if value is not None and not value.lower().startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value

    @property
    def active(self) -> bool:
        """Whether anything is told at all."""
        return bool((self.command or self.url) and self.on)


__all__ = ["NOTIFY_EVENTS", "NotifyConfig", "NotifyEvent"]
