"""timeline.json: bounded however long the run, exact totals after rolling, histograms, sessions."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from harvest.campaign.outputs.timeline import (
    BIN_RATIO,
    MAX_POINTS,
    TIMELINE_FILE,
    Histogram,
    Timeline,
    histograms,
    read_timeline,
)


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def _snap(errors: dict[str, int], done: int) -> dict:
    return {"errors_by_class": errors, "items_per_s": 10.0, "gen_tokens_per_s": 100.0,
            "prompt_tokens_per_s": 50.0, "in_flight": 8, "total": 10**7, "final_before_session": 0,
            "done_this_session": done}


def test_a_long_run_stays_bounded_and_its_totals_survive_rolling(tmp_path: Path):
    clock = Clock()
    tl = Timeline.open(tmp_path, clock=clock)
    tl.write_every_s = 3600.0  # the file is checked once, at the end
    rng = random.Random(7)
    done = errors = 0
    updates = 3 * MAX_POINTS + 13
    for _ in range(updates):
        for _ in range(5):
            status = rng.choice(["done", "done", "truncated", "failed"])
            tl.item(status, rng.uniform(0.01, 30), rng.randint(1, 500), rng.randint(0, 2000))
            done += 1
        errors += 1
        tl.observe_metrics({"http://a:1": {"vllm:num_requests_running": 7, "vllm:num_requests_waiting": 3,
                                           "vllm:kv_cache_usage_perc": 0.5},
                            "http://b:2": {}})
        clock.t += 5.0
        tl.interval(_snap({"http_400": errors}, done))
    tl.close("finished")
    doc, problem = read_timeline(tmp_path)
    assert problem is None and doc is not None
    points = doc["intervals"]
    assert MAX_POINTS // 2 <= len(points) <= MAX_POINTS
    assert doc["stride"] == 4  # 2,173 updates rolled until at most 720 points remain
    # rolling merges, never drops: every item and error is still counted, and the time is covered
    assert sum(p["items"] for p in points) == done
    assert sum(sum(p["statuses"].values()) for p in points) == done
    assert sum(p["errors"].get("http_400", 0) for p in points) == errors
    assert sum(p["dt"] for p in points) == pytest.approx(updates * 5.0, rel=1e-6)
    assert points[-1]["final"] == done
    a = points[0]["endpoints"]["http://a:1"]
    assert a == {"running": 7.0, "waiting": 3.0, "kv_usage": 0.5}
    assert points[0]["endpoints"]["http://b:2"] == {"running": None, "waiting": None, "kv_usage": None}
    assert (tmp_path / TIMELINE_FILE).stat().st_size < 1_000_000
    hs = histograms(doc)
    assert hs["latency_s"].n == done
    assert sum(hs[f"completion_tokens:{s}"].n for s in ("done", "truncated", "failed")) == done


def test_histogram_quantiles_are_within_one_bin():
    rng = random.Random(3)
    values = [rng.lognormvariate(0, 1.5) for _ in range(20_000)]
    h = Histogram(0.001, 100)
    for v in values:
        h.add(v)
    values.sort()
    for q in (0.5, 0.9, 0.99):
        true = values[int(q * len(values)) - 1]
        got = h.quantile(q)
        assert true <= got * 1.0001 and got <= true * BIN_RATIO * 1.0001, (q, true, got)
    assert h.n == len(values) and h.max == values[-1]
    assert Histogram(0.001, 100).quantile(0.5) is None
    zero = Histogram(1.0, 88)
    zero.add(0)
    assert zero.counts[0] == 1 and zero.quantile(0.5) == 0


def test_a_resumed_run_adds_a_session_and_keeps_what_was_recorded(tmp_path: Path):
    clock = Clock()
    first = Timeline.open(tmp_path, clock=clock)
    first.item("done", 1.0, 10, 20)
    clock.t += 1
    first.interval(_snap({}, 1))
    first.close("interrupted")
    clock.t += 100
    second = Timeline.open(tmp_path, clock=clock)
    second.item("truncated", 2.0, 10, 64)
    clock.t += 1
    second.interval(_snap({}, 1))
    second.close("finished")
    doc, _ = read_timeline(tmp_path)
    assert [s["outcome"] for s in doc["sessions"]] == ["interrupted", "finished"]
    assert [p["session"] for p in doc["intervals"]] == [0, 1]
    assert histograms(doc)["latency_s"].n == 2


def test_an_unreadable_timeline_is_started_afresh_and_never_ends_the_run(tmp_path: Path):
    (tmp_path / TIMELINE_FILE).write_text("{not json")
    tl = Timeline.open(tmp_path)
    assert tl.sessions[0]["index"] == 0
    tl.close("finished")
    assert json.loads((tmp_path / TIMELINE_FILE).read_text())["sessions"][0]["outcome"] == "finished"
    (tmp_path / TIMELINE_FILE).write_text('{"schema": "other"}')
    assert read_timeline(tmp_path) == (None, f"{tmp_path / TIMELINE_FILE} is not a harvest.timeline/1 document")
    gone = Timeline(tmp_path / "no-such-dir")
    gone.close("finished")  # the write fails (logged); nothing is raised
    assert not (tmp_path / "no-such-dir").exists()


def test_auto_concurrency_targets_are_recorded_per_endpoint_and_drawn(tmp_path: Path):
    """``concurrency = "auto"``: each endpoint's target goes into the point beside its gauges, survives
    the pairwise merge (averaged), and the report's queue panel draws it; a fixed run records none."""
    from harvest.report.run import _over_time

    clock = Clock()
    tl = Timeline.open(tmp_path, clock=clock)
    url = "http://127.0.0.1:8000"
    tl.observe_metrics({url: {"vllm:num_requests_running": 16.0, "vllm:num_requests_waiting": 0.0}})
    for target in (8, 16, 32, 64):
        clock.t += 1
        tl.interval({**_snap({}, 1), "concurrency_targets": {url: target}})
    tl.close("finished")
    doc, _ = read_timeline(tmp_path)
    assert [p["endpoints"][url]["target"] for p in doc["intervals"]] == [8.0, 16.0, 32.0, 64.0]
    assert doc["intervals"][0]["endpoints"][url]["running"] == 16.0
    html = _over_time(doc, [])
    assert "auto target 127.0.0.1:8000" in html

    (tmp_path / "m").mkdir()
    (tmp_path / "f").mkdir()
    merged = Timeline.open(tmp_path / "m", clock=clock)
    merged.stride = 2  # two updates per point: the targets are averaged over them
    for target in (8, 24):
        clock.t += 1
        merged.interval({**_snap({}, 1), "concurrency_targets": {url: target}})
    merged.close("finished")
    doc, _ = read_timeline(tmp_path / "m")
    assert doc["intervals"][-1]["endpoints"][url]["target"] == 16.0

    fixed = Timeline.open(tmp_path / "f", clock=clock)
    clock.t += 1
    fixed.interval(_snap({}, 1))
    fixed.close("finished")
    doc, _ = read_timeline(tmp_path / "f")
    assert all("target" not in e for p in doc["intervals"] for e in p["endpoints"].values())
    assert "auto target" not in _over_time(doc, [])


def test_token_counts_out_of_range_are_counted_as_unknown_not_summed(tmp_path: Path):
    # Counts stored by an older harvest or a crafted ledger: NaN, 1e308, inf, negative never crash the
    # flush nor reach the file as such.
    timeline = Timeline.open(tmp_path, clock=Clock())
    for prompt, completion in ((float("nan"), 1e308), (-5.0, float("inf")), (7.0, 9.0)):
        timeline.item("done", 0.5, prompt, completion)  # type: ignore[arg-type]
    timeline.interval(_snap({}, 3))
    timeline.close("finished")
    doc, _ = read_timeline(tmp_path)
    assert doc is not None
    point = doc["intervals"][-1]
    assert (point["prompt_tokens"], point["completion_tokens"], point["items"]) == (7, 9, 3)
