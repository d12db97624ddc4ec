"""The demo's prompts through the shared vLLM CPU server, exported for SpecForge: the file passes
SpecForge's validation rules (tests/campaign/specforge_rules.py) and carries the dataset's own ids.

The demo's random-weight model never stops on its own, so its items end ``truncated``: they are
exported only when asked (``--status done,truncated``), marked ``"truncated": true``.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from harvest.campaign.demo import PROMPTS
from harvest.campaign.outputs.export import export_run
from tests.placed import run_campaign
from harvest.config import parse_config
from harvest.ledger import Status
from tests.campaign.specforge_rules import check_file

pytestmark = pytest.mark.engine


def test_demo_specforge_export_passes_specforge_validation(tmp_path, vllm_server):
    ids = [json.loads(line)["id"] for line in PROMPTS.read_text().splitlines() if line.strip()]
    job = parse_config({"data": {"path": str(PROMPTS)},  # no id_field: the rows' own ids
                        "sampling": {"max_tokens": 24, "temperature": 0.0},
                        "client": {"endpoints": [vllm_server.url], "concurrency": 16, "health_deadline": 60},
                        "output": {"dir": str(tmp_path / "run")}}, source=str(tmp_path / "job.toml"))
    report = asyncio.run(run_campaign(job))
    assert report.outcome == "finished" and report.totals.ok, report.totals.describe()
    answered = report.totals.counts[Status.DONE] + report.totals.counts[Status.TRUNCATED]
    assert answered == len(ids)

    default = export_run(tmp_path / "run", "specforge")
    assert default.by_status.get("truncated", 0) == 0  # truncated answers only when asked
    out = export_run(tmp_path / "run", "specforge", statuses=["done", "truncated"])
    rows = [json.loads(line) for line in out.path.read_text().splitlines()]
    assert out.written + out.malformed == answered and out.written > 0
    assert all(r["status"] == "success" for r in rows)
    assert sum(1 for r in rows if r.get("truncated") is True) == out.by_status.get("truncated", 0)
    assert {r["id"] for r in rows} <= set(ids)  # the dataset's own ids, not content hashes
    rows_checked, answers = check_file(out.path)  # SpecForge would train on this file as is
    assert rows_checked == out.written and answers >= out.written
