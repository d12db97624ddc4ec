"""A campaign: ``run_campaign(config, placement=...)`` and the report of how its session ended
(``session.py``); the steps it runs live beside it, one module each.

The names below are loaded on first use (PEP 562): a command that needs one step only (``harvest
stop`` reads ``runner.py``) starts without the session's client, engines and timeline."""

from __future__ import annotations

from typing import TYPE_CHECKING

from harvest.lazy import lazy

if TYPE_CHECKING:
    from harvest.campaign.run.session import (Launcher, RunReport, dataset_fingerprint, engine_limit,
                                              output_settings, run_campaign)

__all__ = ["Launcher", "RunReport", "dataset_fingerprint", "engine_limit", "output_settings", "run_campaign"]


__getattr__ = lazy(__name__, dict.fromkeys(__all__, "harvest.campaign.run.session"))
