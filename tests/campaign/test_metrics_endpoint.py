"""harvest's own ``/metrics`` (``[client] metrics_port``) scraped during a run: it parses with
prometheus_client's parser, names follow Prometheus' conventions, and its item counters equal
``harvest status --json``'s counts at the moment of the scrape.

The endpoint is the suite's own on loopback (tests/campaign/loopback.py), streaming its answers
(so the TTFT and TPOT histograms fill); from the 40th answer on it holds every completion, so the
ledger stands still while the test scrapes and asks ``harvest status --json``; then it answers again
and the run finishes.
"""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from harvest.config import parse_config
from harvest.ledger import Ledger
from tests import harvest_process
from tests.campaign.loopback import Endpoint
from tests.placed import run_campaign

N = 120
HOLD = 40


def scrape(url: str) -> dict[str, dict[tuple, float]]:
    """name -> {labels: value} of one scrape, parsed by prometheus_client."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def status_counts(run_dir: Path) -> dict[str, int]:
    out = harvest_process.run([sys.executable, "-m", "harvest", "status", str(run_dir), "--json"], capture_output=True,
                              text=True, timeout=60, check=True)
    return json.loads(out.stdout)["counts"]


def metric_counts(m: dict[str, dict[tuple, float]]) -> dict[str, int]:
    counts = {dict(k)["status"]: int(v) for k, v in m["harvest_items_total"].items()}
    counts.update({dict(k)["status"]: int(v) for k, v in m["harvest_items_remaining"].items()})
    return counts


def done_in_ledger(run_dir: Path) -> int:
    try:
        ledger = Ledger.open_readonly(run_dir)
    except Exception:  # noqa: BLE001 - not created yet
        return -1
    try:
        return ledger.counts()[next(s for s in ledger.counts() if s.value == "done")]
    finally:
        ledger.close()


async def test_metrics_scraped_during_a_run_parse_and_count_what_status_counts(tmp_path):
    run_dir = tmp_path / "run"
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"id": f"m{i}", "prompt": f"Count {i}."}) + "\n" for i in range(N)))
    with Endpoint() as ep:
        ep.hold_after(HOLD)
        config = parse_config({
            "data": {"path": str(data), "id_field": "id"}, "sampling": {"max_tokens": 8},
            "client": {"endpoints": [ep.url], "concurrency": 4, "stream": True, "metrics_port": 0},
            "run": {"progress_interval": 0.2}, "output": {"dir": str(run_dir)}})
        task = asyncio.create_task(run_campaign(config))
        url = None
        for _ in range(600):  # the 40 answers committed, the rest held, and the gauges of that moment
            await asyncio.sleep(0.05)
            assert not task.done(), task.result()
            if url is None and (run_dir / "runner.json").exists():
                record = json.loads((run_dir / "runner.json").read_text())
                url = record["metrics"]
                assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics"), record
            if url is None or ep.answered < HOLD or await asyncio.to_thread(done_in_ledger, run_dir) != HOLD:
                continue
            # the gauges are set at each progress update (0.2 s): the one after the 4 held went out
            held = (await asyncio.to_thread(scrape, url)).get("harvest_requests_in_flight", {})
            if held.get((("endpoint", ep.url),)) == 4:
                break
        assert url is not None
        first = await asyncio.to_thread(scrape, url)
        counts = await asyncio.to_thread(status_counts, run_dir)
        second = await asyncio.to_thread(scrape, url)
        ep.release()
        report = await asyncio.wait_for(task, 120)
    assert report.ok
    assert metric_counts(first) == counts == metric_counts(second), (metric_counts(first), counts)
    # running: the items claimed (4 on the wire, the rest in harvest's queue)
    assert counts["done"] == HOLD and counts["running"] >= 4 and counts["pending"] + counts["running"] == N - HOLD
    m = second
    # conventions: counters end in _total, units in the name, histograms in base units
    assert m["harvest_session_items_total"][(("status", "done"),)] == HOLD
    assert m["harvest_generated_tokens_total"][()] == 3 * HOLD and m["harvest_prompt_tokens_total"][()] == 5 * HOLD
    assert m["harvest_request_duration_seconds_count"][()] == HOLD
    assert m["harvest_time_to_first_token_seconds_count"][()] == HOLD
    assert m["harvest_time_per_output_token_seconds_count"][()] == HOLD
    endpoint = ((("endpoint", ep.url),))
    assert m["harvest_requests_in_flight"][endpoint] == 4
    assert m["harvest_concurrency_limit"][(("endpoint", "all"),)] == 4
    assert m["harvest_server_relaunches_total"][()] == 0
    assert ("harvest_run_info" in m and "harvest_errors_total" not in m)  # no error yet: no sample
    assert not any(name.startswith("harvest_") and name.endswith("_total_total") for name in m)
    try:  # served only while the run goes
        urllib.request.urlopen(url, timeout=2)
        raise AssertionError("/metrics still served after the run")
    except OSError:
        pass


def test_the_documented_metrics_are_the_served_ones_and_the_dashboard_asks_only_for_them(tmp_path):
    """docs/metrics.md's table names every family /metrics serves and no other; the Grafana
    dashboard (docs/grafana-harvest.json) queries only those."""
    import re

    from prometheus_client import generate_latest

    from harvest.campaign.outputs.prometheus import RunMetrics

    metrics = RunMetrics(lambda: str(tmp_path), run_dir=str(tmp_path))
    metrics.error("http_400")  # a family with a label appears once it has a sample
    metrics.hung("http://e")
    metrics.observe({"concurrency": 4, "concurrency_targets": {}}, None)
    served = {f.name + ("_total" if f.type == "counter" else "")
              for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())
              if not f.name.endswith("_created")}  # prometheus_client's creation times of each counter
    docs = Path(__file__).resolve().parents[2] / "docs"
    documented = set(re.findall(r"^\| `(harvest_\w+)` \|", (docs / "metrics.md").read_text(), re.M))
    missing = {"harvest_items_total", "harvest_items_remaining", "harvest_requests_in_flight", "harvest_endpoint_healthy"}
    assert documented == served | missing, (documented ^ (served | missing))
    asked = set(re.findall(r"\b(harvest_\w+?)(?:_bucket)?\b", (docs / "grafana-harvest.json").read_text()))
    assert asked <= documented, asked - documented
