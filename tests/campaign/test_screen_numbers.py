"""The numbers harvest shows mean what their labels say, against bench/sim_engine.py (a simulated
engine is enough for the display):

- an endpoint that stops answering in the middle of a run is shown as such: the progress lines and
  progress.json name it, with the seconds waited and the health deadline, and nothing is "sent"
  meanwhile (the run is ``harvest run --no-live`` in a subprocess, stopped with SIGINT);
- latency runs from the request being sent; the wait in harvest's own queue is recorded apart.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from tests import harvest_process

SIM_ENGINE = Path(__file__).resolve().parents[2] / "bench" / "sim_engine.py"


def test_a_sick_endpoint_is_shown_with_the_time_waited_and_the_deadline(tmp_path):
    sim = subprocess.Popen([sys.executable, str(SIM_ENGINE), "--port", "0", "--token-latency", "0.05",
                            "--max-batch", "4", "--output-tokens", "2"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    run = None
    try:
        m = re.search(r"listening on ([\d.]+):(\d+)", sim.stdout.readline())  # type: ignore[union-attr]
        assert m
        (tmp_path / "in.jsonl").write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(400)))
        (tmp_path / "job.toml").write_text(
            f'[server]\nengine = "openai"\nbase_url = "http://{m.group(1)}:{m.group(2)}"\nmodel = "sim-model"\n'
            '[data]\npath = "in.jsonl"\n[sampling]\nmax_tokens = 4\n'
            '[client]\nconcurrency = 4\nhealth_deadline = 300\n[run]\nprogress_interval = 0.3\n'
            '[output]\ndir = "run"\n')
        run = harvest_process.popen([sys.executable, "-m", "harvest.cli.main", "run", "job.toml", "--no-live"],
                                    cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    start_new_session=True)
        progress = tmp_path / "run" / "progress.json"
        deadline = time.monotonic() + 120
        while True:  # some results first, then the endpoint goes away
            assert time.monotonic() < deadline and run.poll() is None, "no progress"
            if progress.exists() and json.loads(progress.read_text()).get("done_this_session", 0) >= 8:
                break
            time.sleep(0.1)
        os.killpg(sim.pid, signal.SIGKILL)  # the engine this test started
        sim.wait(timeout=15)
        seen = None
        while seen is None or seen["waited_s"] < 3:
            assert time.monotonic() < deadline and run.poll() is None, "the sick endpoint was never shown"
            snap = json.loads(progress.read_text())
            seen = (snap.get("sick") or [None])[0]
            time.sleep(0.2)
        assert seen["deadline_s"] == 300 and seen["url"].startswith("http://127.0.0.1:"), seen
        assert json.loads(progress.read_text())["sent"] == 0  # nothing on the wire while it is sick
        os.killpg(run.pid, signal.SIGINT)  # stop the run this test started; it releases what it held
        out, err = run.communicate(timeout=120)
    finally:
        for proc in (run, sim):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=15)
    assert run.returncode == 130, out + err
    lines = [line for line in err.splitlines() if line.startswith("[harvest] ") and "not answering" in line]
    assert lines, err[-3000:]
    waited = [int(x) for x in re.findall(r"not answering: (\d+) s waited of the 300 s health_deadline", "\n".join(lines))]
    assert waited and waited == sorted(waited) and waited[-1] >= 3, lines
    assert "again to resume" in err


def test_latency_runs_from_the_request_being_sent_and_the_queue_wait_is_recorded_apart(tmp_path):
    """Concurrency 2, items claimed ahead (twice as many), an engine that never queues (batch 16)
    and takes about 1 s a request: an item's latency is about one request, and the second request
    time it spent claimed but not yet sent is recorded as its queue wait, not as latency."""
    import asyncio

    from tests.placed import run_campaign
    from harvest.campaign.outputs.timeline import histograms, read_timeline
    from harvest.config import parse_config

    sim = subprocess.Popen([sys.executable, str(SIM_ENGINE), "--port", "0", "--token-latency", "0.5",
                            "--max-batch", "16", "--output-tokens", "2"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        m = re.search(r"listening on ([\d.]+):(\d+)", sim.stdout.readline())  # type: ignore[union-attr]
        assert m
        (tmp_path / "in.jsonl").write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(16)))
        config = parse_config({"server": {"engine": "openai", "base_url": f"http://{m.group(1)}:{m.group(2)}",
                                          "model": "sim-model"},
                               "data": {"path": str(tmp_path / "in.jsonl")}, "sampling": {"max_tokens": 4},
                               "client": {"concurrency": 2}, "run": {"progress_interval": 0.5},
                               "output": {"dir": str(tmp_path / "run")}}, source=str(tmp_path / "job.toml"))
        report = asyncio.run(run_campaign(config))
    finally:
        os.killpg(sim.pid, signal.SIGTERM)  # the engine this test started
        sim.wait(timeout=15)
    assert report.ok, report
    doc, problem = read_timeline(tmp_path / "run")
    assert doc is not None, problem
    hs = histograms(doc)
    latency, queue = hs["latency_s"], hs["queue_s"]
    assert latency.n == 16 and queue.n == 16
    # One request is 2-3 decode steps of 0.5 s (1-1.5 s); the wait in harvest's queue is about as
    # long again for all but the first two items. Timing on the latency from the claim would put
    # the median near two requests (2-3 s).
    per_request = latency.sum / latency.n
    assert 0.9 <= per_request <= 2.2, per_request
    assert queue.sum / queue.n >= 0.4 * per_request, (queue.sum / queue.n, per_request)
    assert queue.max >= per_request * 0.8
