"""The prefix-cache hit rate, end to end on vLLM's CPU build: items that share a long system prompt,
``harvest run`` with the default config against the shared vLLM server (an endpoint harvest does
not manage, so the test reads the engine's own counters before and after). The rate harvest shows
in ``status --json``, in its progress line and panel, and in the report equals the rate computed
from the engine's ``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total`` over the
run, within a point; vLLM's queue and KV-cache gauges reach the timeline and the report's chart. A busy vLLM CPU engine may answer no /metrics scrape while it generates: the
figure must not depend on one landing.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from tests import harvest_process

pytestmark = pytest.mark.engine

ITEMS = 120
#: About 900 tokens shared by every item (the tiny model's context is 2048 here).
SYSTEM = "You answer questions about a long shared manual. " + " ".join(
    f"Rule {i}: keep the answer short and name the rule number." for i in range(70))


def engine_counters(url: str) -> tuple[float, float]:
    """(hits, queries) summed over the engine's own /metrics lines, parsed here, not by harvest."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    sums = {"hits": 0.0, "queries": 0.0}
    for kind in sums:
        for m in re.finditer(rf"^vllm:prefix_cache_{kind}_total(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text, re.M):
            sums[kind] += float(m.group(1))
    return sums["hits"], sums["queries"]


def harvest(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return harvest_process.run([sys.executable, "-m", "harvest.cli.main", *argv], capture_output=True, text=True,
                               timeout=600, stdin=subprocess.DEVNULL, cwd=cwd)


def test_the_hit_rate_shown_is_the_engines_own_over_the_run(tmp_path, vllm_server):
    rows = [{"id": f"p{i}", "messages": [{"role": "system", "content": SYSTEM},
                                         {"role": "user", "content": f"What does rule {i % 70} say?"}]}
            for i in range(ITEMS)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "job.toml").write_text(
        f'[server]\nengine = "openai"\nbase_url = "{vllm_server.url}"\nmodel = "{vllm_server.model}"\n'
        '[data]\npath = "in.jsonl"\n[sampling]\nmax_tokens = 4\n[output]\ndir = "run"\n')

    hits0, queries0 = engine_counters(vllm_server.url)
    proc = harvest("run", "job.toml", "--no-live", cwd=tmp_path)
    hits1, queries1 = engine_counters(vllm_server.url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert queries1 - queries0 > ITEMS * 500, (queries0, queries1)  # every prompt was looked up
    engine_rate = (hits1 - hits0) / (queries1 - queries0)
    assert engine_rate > 0.5, engine_rate  # a shared prefix of ~900 tokens: most of each prompt is a hit

    status = harvest("status", "run", "--json", cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    shown = json.loads(status.stdout)["progress"]["prefix_cache_hit_rate"]
    assert shown is not None and abs(shown - engine_rate) <= 0.01, (shown, engine_rate)

    last = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("[harvest] ") and " items, " in line][-1]
    found = re.search(r"prefix cache hits (\d+)%", last)
    assert found and abs(int(found.group(1)) / 100 - engine_rate) <= 0.01 + 0.005, (last, engine_rate)

    from rich.console import Console

    from harvest.campaign.outputs.progress import PROGRESS_FILE, ProgressView
    from harvest.cli.panel import run_panel
    from harvest.cli.phases import PhaseBoard

    snap = json.loads((tmp_path / "run" / PROGRESS_FILE).read_text())
    panel = io.StringIO()
    Console(file=panel, width=120).print(run_panel(ProgressView(tmp_path / "run", snap), PhaseBoard(), 110))
    found = re.search(r"cache\s+prefix cache hits (\d+)%", panel.getvalue())
    assert found and abs(int(found.group(1)) / 100 - engine_rate) <= 0.015, (panel.getvalue(), engine_rate)

    report = harvest("report", "run", "-o", "report.html", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "report.html").read_text()
    found = re.search(r"([\d.]+)% of prompt tokens \(last session, engine counters\)", page)
    assert found and abs(float(found.group(1)) / 100 - engine_rate) <= 0.01, engine_rate

    # vLLM's gauges fed the timeline, KV-cache use included, and the report draws it
    timeline = json.loads((tmp_path / "run" / "timeline.json").read_text())
    read = [e for p in timeline["intervals"] for e in p["endpoints"].values() if e.get("running") is not None]
    assert read and all(e.get("waiting") is not None and e.get("kv_usage") is not None for e in read), read
    assert "KV use" in page
