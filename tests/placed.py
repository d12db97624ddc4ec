"""The campaign, tune and compare entry points called as the commands call them: with the placement
chosen once from the job's own tables (``harvest.placement.from_config``), which each requires."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harvest.campaign.run import RunReport
from harvest.campaign.run import run_campaign as _run_campaign
from harvest.campaign.sweep.compare import CompareReport
from harvest.campaign.sweep.compare import compare as _compare
from harvest.campaign.sweep.tune import TuneReport
from harvest.campaign.sweep.tune_file import TuneFile
from harvest.campaign.sweep.tune import tune as _tune
from harvest.config import HarvestConfig
from harvest.placement import from_config


async def run_campaign(config: HarvestConfig, **kw: Any) -> RunReport:
    return await _run_campaign(config, placement=from_config(config), **kw)


async def tune(job: HarvestConfig, tune_file: TuneFile, **kw: Any) -> TuneReport:
    return await _tune(job, tune_file, placement=from_config(job), **kw)


async def compare(reference: HarvestConfig, candidates: Sequence[HarvestConfig], **kw: Any) -> CompareReport:
    return await _compare(reference, candidates, placement=from_config(reference), **kw)
