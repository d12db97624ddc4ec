"""A campaign: ``run_campaign(config, placement=...)`` and the report of how its session ended
(``session.py``); the steps it runs live beside it, one module each."""

from harvest.campaign.run.session import (Launcher, RunReport, dataset_fingerprint, engine_limit, output_settings,
                                          run_campaign)

__all__ = ["Launcher", "RunReport", "dataset_fingerprint", "engine_limit", "output_settings", "run_campaign"]
