"""``harvest report`` opened in a real headless Chromium, for each kind of folder, made by real runs.

- a run whose managed server is SIGKILLed in the middle (its process group, from the launch record)
  and relaunched by harvest: on llama-server with the tiny model (two over-long prompts are
  skipped before sending: they cannot fit the model's context), and on the deterministic chat
  stand-in (tests/quality/chat_engine.py as a ``command`` engine);
- a tune sweep over the chat stand-in with a pass, a quality failure, a policy rejection, a trial
  whose server cannot start (out of memory) and the larger setting skipped after it;
- a compare of the chat stand-in: a degraded candidate, a slower one, a policy rejection.

Each page is checked in the browser: no console error, every chart present and drawn, no request
but the page itself, and every number tagged with its document path equal to that document
(``harvest status --json`` for a run, tune.json, compare.json). Screenshots and a printed PDF of
each page stay in the test's folder.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests import harvest_process
from tests.placed import compare
from tests.placed import run_campaign
from harvest.config import parse_config
from harvest.quality.settings import PolicySettings, ProbeSettings, QualitySettings
from tests import engines
from tests.campaign.ledger_peek import results_count
from tests.report.browser import Browser, Page

CHAT_ENGINE = Path(__file__).resolve().parents[1] / "quality" / "chat_engine.py"

# Checked per test before any fixture (tests/conftest.py): no vLLM run is made for a browser that is
# not here, and in CI a missing Chromium fails these tests, not the whole session's collection.
# Real engines (llama-server, the chat stand-in) make the folders; a real Chromium opens the pages.
pytestmark = [pytest.mark.realpart("chromium", "the reports are opened in a real headless Chromium"),
              pytest.mark.engine]


def harvest(*argv: str, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = harvest_process.run([sys.executable, "-m", "harvest.cli.main", *argv], capture_output=True, text=True,
                               timeout=600, stdin=subprocess.DEVNULL, env=env)
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def lookup(doc: Any, path: str) -> Any:
    for part in path.split("."):
        if isinstance(doc, list):
            doc = doc[int(part)]
        else:
            doc = doc[part]
    return doc


def check_page(page: Page, report: Path, doc: dict[str, Any], charts: set[str], shots: Path) -> dict[str, Any]:
    """The checks every report passes; returns what the page showed (charts, tagged numbers)."""
    page.screenshot(shots / f"{report.stem}.png")
    page.print_pdf(shots / f"{report.stem}.pdf")
    assert (shots / f"{report.stem}.png").stat().st_size > 10_000
    assert (shots / f"{report.stem}.pdf").read_bytes()[:5] == b"%PDF-"
    assert page.console_errors == [], page.console_errors
    assert page.requests == [report.resolve().as_uri()], page.requests  # nothing but the page itself
    shown = page.evaluate("""(() => {
        const charts = {};
        for (const f of document.querySelectorAll('figure[data-chart]')) {
            const svg = f.querySelector('svg');
            const r = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
            charts[f.dataset.chart] = {width: r.width, height: r.height,
                marks: svg ? svg.querySelectorAll('path, use, rect, line, polyline').length : 0,
                text: svg ? svg.textContent : ''};
        }
        const numbers = [...document.querySelectorAll('[data-json]')].map(e => [e.dataset.json, e.textContent]);
        return {charts, numbers, scripts: document.scripts.length,
                external: [...document.querySelectorAll('[src], link[href]')].map(e => e.outerHTML)};
    })()""")
    assert shown["scripts"] == 0 and shown["external"] == []
    assert charts <= set(shown["charts"]), (charts, list(shown["charts"]))
    for name, chart in shown["charts"].items():
        assert chart["width"] > 200 and chart["height"] > 80, (name, chart)
        assert chart["marks"] > 10, (name, chart)  # axes, ticks and the data drawn
    assert shown["numbers"], "no number on the page is tagged with its document path"
    for path, text in shown["numbers"]:
        expected = lookup(doc, path)
        if isinstance(expected, bool):
            assert text == ("OK" if expected else "CHECK"), (path, text, expected)
        elif expected is None:
            assert text == "-", (path, text)
        else:
            got = float(text.replace(",", ""))
            assert got == pytest.approx(expected, rel=1e-3, abs=1e-9), (path, text, expected)
    return shown


#: The queue panel of the over-time chart as drawn: each legend's texts, and the largest value of
#: the "sent" series (its path, named by its SVG id, read back through the second panel's y ticks),
#: None when that line or its ticks are not found, and the value of one point of height there (the
#: path's coordinates are written to 0.01 point).
QUEUE_PANEL = """(() => {
    const svg = document.querySelector('figure[data-chart="over-time"] svg');
    const legends = [...svg.querySelectorAll('g[id^="legend"]')].map(
        g => [...g.querySelectorAll('text')].map(t => t.textContent));
    const axes = svg.querySelector('#axes_2');
    const ticks = [...axes.querySelectorAll('g[id^="ytick"]')].map(g => {
        const mark = g.querySelector('line'), text = g.querySelector('text');
        return mark && text ? [parseFloat(mark.getAttribute('y1')), parseFloat(text.textContent.replace(/,/g, ''))]
                           : null; }).filter(t => t && isFinite(t[0]) && isFinite(t[1]));
    const line = [...axes.querySelectorAll('g[id="line: sent (on the wire)"] > path')].find(
        p => !p.closest('g[id^="legend"]'));
    if (!line || ticks.length < 2) return {legends, sent_max: null, points: 0};
    const [[y0, v0], [y1, v1]] = [ticks[0], ticks[ticks.length - 1]];
    const ys = [...line.getAttribute('d').matchAll(/[ML] ([-\\d.]+) ([-\\d.]+)/g)].map(m => parseFloat(m[2]));
    const values = ys.map(y => v0 + (y - y0) * (v1 - v0) / (y1 - y0));
    return {legends, sent_max: Math.max(...values), points: values.length,
            per_point: Math.abs((v1 - v0) / (y1 - y0))};
})()"""


# --- a run with a server kill in the middle ------------------------------------------------------------------


def _kill_mid_run(config: Any, run_dir: Path, after: int) -> Any:
    async def scenario() -> Any:
        task = asyncio.create_task(run_campaign(config))
        deadline = time.monotonic() + 600
        while results_count(run_dir) < after:
            assert not task.done(), "the run ended before the server could be killed"
            assert time.monotonic() < deadline, "no progress before the kill"
            await asyncio.sleep(0.05)
        record = json.loads((run_dir / "server" / "launch.json").read_text())
        os.killpg(record["record"]["pgid"], signal.SIGKILL)  # the server this test's run launched
        return await asyncio.wait_for(task, timeout=900)

    return asyncio.run(scenario())


def _prompts(path: Path, n: int, *, long: int = 0) -> Path:
    rows = [{"id": f"r{i}", "prompt": f"Tell me about item {i}."} for i in range(n)]
    rows += [{"id": f"long{i}", "prompt": " ".join(["word"] * 5000)} for i in range(long)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("chat-run")
    run_dir = root / "run"
    config = parse_config({
        "server": {"engine": "command", "port": engines.free_port(), "ready_timeout": 30, "stop_grace": 2,
                   "stop_deadline": 6, "health_url": "http://{host}:{port}/health",
                   "command": [sys.executable, str(CHAT_ENGINE), "--host", "{host}", "--port", "{port}",
                               "--delay", "0.02"]},
        "preflight": {"min_disk_free_gib": 0.05},
        "data": {"path": str(_prompts(root / "in.jsonl", 400)), "id_field": "id"},
        "sampling": {"max_tokens": 12},
        "client": {"concurrency": 8, "health_deadline": 60, "max_retries": 0},
        "output": {"dir": str(run_dir)}, "run": {"progress_interval": 0.3}})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HARVEST_STATE_DIR", str(root / "state"))
        report = _kill_mid_run(config, run_dir, after=120)
    assert report.outcome == "finished" and report.relaunches == 1, report
    return run_dir


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory: pytest.TempPathFactory, llama_server_bin: str, tiny_gguf: Path) -> Path:
    """A run on a real engine that is fast to start (llama-server: what is under test is the report,
    not the engine; vLLM's own metrics in a report are tests/campaign/test_prefix_cache.py's)."""
    root = tmp_path_factory.mktemp("llama-run")
    run_dir = root / "run"
    config = parse_config({
        "server": {"engine": "llamacpp", "model": str(tiny_gguf), "command": [llama_server_bin],
                   "port": engines.free_port(), "extra_args": ["-c", "4096"], "ready_timeout": 120,
                   "stop_grace": 5, "stop_deadline": 60},
        "preflight": {"min_disk_free_gib": 0.05},
        # 400 items: the run outlasts several 0.5 s scrapes of /metrics after the relaunch (with 160 it
        # took 3 s on a loaded machine, and none of its five scrapes landed).
        "data": {"path": str(_prompts(root / "in.jsonl", 400, long=2)), "id_field": "id"},
        "sampling": {"max_tokens": 24},
        "client": {"concurrency": 8, "health_deadline": 120, "max_retries": 0},
        "output": {"dir": str(run_dir)}, "run": {"progress_interval": 0.5}})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HARVEST_STATE_DIR", str(root / "state"))
        report = _kill_mid_run(config, run_dir, after=40)
    assert report.outcome == "finished" and report.relaunches == 1, report
    return run_dir


def _check_run(run_dir: Path, tmp_path: Path, *, failed: int, skipped: int = 0, concurrency: int = 8
               ) -> dict[str, Any]:
    out = tmp_path / "run-report.html"
    proc = harvest("report", str(run_dir), "-o", str(out))
    assert proc.stdout.strip() == str(out)
    status = json.loads(harvest("status", str(run_dir), "--json").stdout)
    assert status["counts"]["failed"] == failed and status["totals"]["ok"]
    assert status["counts"]["skipped"] == skipped
    with Browser.start(tmp_path / "chromium") as browser:
        page = browser.open(out)
        shown = check_page(page, out, status, {"status", "over-time", "latency", "output-length"}, tmp_path)
        stops = page.evaluate("[...document.querySelectorAll('[data-stop-verdict]')].map(e => e.dataset.stopVerdict)")
        title = page.evaluate("document.title")
        queue = page.evaluate(QUEUE_PANEL)
    # The queue panel splits what the panel shows apart: on the wire, and claimed ahead in harvest.
    queue_legend = next((texts for texts in queue["legends"] if "sent (on the wire)" in texts), None)
    assert queue_legend is not None, queue["legends"]
    assert queue_legend[:2] == ["sent (on the wire)", "claimed ahead (harvest's queue)"], queue_legend
    assert all(re.fullmatch(r"(running|waiting|auto target) \S+:\d+", x) for x in queue_legend[2:]), queue_legend
    assert not any("claimed (sent + harvest's queue)" in texts for texts in queue["legends"]), queue["legends"]
    # The sent series as drawn never goes past the concurrency, and is drawn (requests went out).
    assert queue["points"] > 2 and queue["sent_max"] is not None, queue
    assert 0 < queue["sent_max"] <= concurrency + 0.01 * queue["per_point"], queue
    recorded = [p["sent"] for p in json.loads((run_dir / "timeline.json").read_text())["intervals"]
                if p.get("sent") is not None]
    assert recorded and max(recorded) <= concurrency, recorded
    # every count and the totals identity are on the page, tagged
    paths = {p for p, _ in shown["numbers"]}
    assert {f"counts.{s}" for s in status["counts"]} <= paths and "totals.unique" in paths
    assert stops == ["clean", "clean"]  # the killed server's verified stop, then the relaunched one's
    over_time = shown["charts"]["over-time"]["text"]
    assert "server stopped" in over_time and "server down (relaunch)" in over_time and "gen tok/s" in over_time
    assert run_dir.name in title
    return shown


def test_run_report_of_a_server_killed_mid_run_chat(chat_run: Path, tmp_path: Path):
    _check_run(chat_run, tmp_path, failed=0)


@pytest.mark.engine
@pytest.mark.slow
def test_run_report_of_a_server_killed_mid_run_llama(llama_run: Path, tmp_path: Path):
    shown = _check_run(llama_run, tmp_path, failed=0, skipped=2)
    assert "counts.skipped" in {p for p, _ in shown["numbers"]}
    assert "context_length" in (tmp_path / "run-report.html").read_text()  # errors seen, by class
    # the engine's /metrics fed the queue panel: the endpoint's running and waiting requests were
    # read. (Not "running > 0": the tiny model decodes in well under a millisecond, so on a fast
    # machine a 0.5 s scrape may never land while a request runs.)
    doc = json.loads((llama_run / "timeline.json").read_text())
    read = [e for p in doc["intervals"] for e in p["endpoints"].values() if e.get("running") is not None]
    assert read, doc["intervals"]
    assert all(e.get("waiting") is not None for e in read), read


# --- a tune sweep ------------------------------------------------------------------------------------------


def _chat_job(tmp_path: Path, data: Path, *flags: str) -> Any:
    return parse_config({
        "server": {"engine": "command", "port": engines.free_port(), "max_running_requests": 4,
                   "command": [sys.executable, str(CHAT_ENGINE), "--host", "{host}", "--port", "{port}", *flags],
                   "health_url": "http://{host}:{port}/health", "ready_timeout": 30, "stop_grace": 2,
                   "stop_deadline": 6},
        "preflight": {"min_disk_free_gib": 0.05},
        "data": {"path": str(data), "id_field": "id"},
        "sampling": {"max_tokens": 8},
        "output": {"dir": str(tmp_path / "run")},
    }, source=str(tmp_path / "job.toml"))


def _chat_job_file(tmp_path: Path, data: Path, items_dir: str = "run") -> Path:
    job = tmp_path / "job.toml"
    command = json.dumps([sys.executable, str(CHAT_ENGINE), "--host", "{host}", "--port", "{port}"])
    job.write_text(f"""
[server]
engine = "command"
port = {engines.free_port()}
max_running_requests = 4
command = {command}
health_url = "http://{{host}}:{{port}}/health"
ready_timeout = 30
stop_grace = 2
stop_deadline = 6

[preflight]
min_disk_free_gib = 0.05

[data]
path = {json.dumps(str(data))}
id_field = "id"

[sampling]
max_tokens = 8

[output]
dir = {json.dumps(str(tmp_path / items_dir))}
""")
    return job


def test_tune_report(tmp_path: Path):
    """``harvest tune`` writes the report and prints its path; the page shows every verdict."""
    job = _chat_job_file(tmp_path, _prompts(tmp_path / "in.jsonl", 30))
    grid = tmp_path / "tune.toml"
    grid.write_text("""
[[grid]]
extra_args = [[], ["--perturb", "0.7"]]
[[grid]]
kv_cache_dtype = ["fp8"]
[[grid]]
extra_args = [["--oom"]]
max_running_requests = [4, 8]
[[grid]]
extra_args = [["--delay", "0.01"]]

[probe]
prompts = 10
max_tokens = 12

[policy]
forbid = ["kv_cache_dtype=fp8*"]

[throughput]
prompts = 20
concurrency = 8
""")
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}
    proc = harvest("tune", str(job), "--grid", str(grid), env=env)
    tune_dir = tmp_path / "run" / "tune"
    doc = json.loads((tune_dir / "tune.json").read_text())
    verdicts = [t["verdict"] for t in doc["trials"]]
    assert verdicts == ["pass", "fail", "rejected", "failed", "skipped", "pass"]
    out = tune_dir / "report.html"
    assert f"report: {out}" in proc.stdout.splitlines()
    with Browser.start(tmp_path / "chromium") as browser:
        page = browser.open(out)
        shown = check_page(page, out, doc, {"tok-vs-quality", "trials"}, tmp_path)
        shown_verdicts = page.evaluate("[...document.querySelectorAll('table[data-table=trials] [data-verdict]')]"
                                       ".map(e => e.dataset.verdict)")
        best_row = page.evaluate("[...document.querySelectorAll('table[data-table=trials] tr.best')]"
                                 ".map(r => r.cells[0].textContent)")
        stops = page.evaluate("[...document.querySelectorAll('[data-stop-verdict]')].map(e => e.dataset.stopVerdict)")
    assert shown_verdicts == verdicts
    assert doc["best"] is not None and len(best_row) == 1 and best_row[0].startswith(f"{doc['best']} ")
    assert "chosen" in best_row[0]
    assert "noise floor" in shown["charts"]["tok-vs-quality"]["text"]
    for verdict in ("rejected", "skipped", "failed"):
        assert verdict in shown["charts"]["trials"]["text"]
    assert len(stops) == len(doc["launches"]) and set(stops) == {"clean"}


# --- a comparison ------------------------------------------------------------------------------------------


def test_compare_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HARVEST_STATE_DIR", str(tmp_path / "state"))
    data = _prompts(tmp_path / "in.jsonl", 16)
    ref = _chat_job(tmp_path, data)
    fp8 = ref.model_copy(update={"server": ref.server.model_copy(update={"kv_cache_dtype": "fp8"})})
    settings = QualitySettings(probe=ProbeSettings(prompts=10, max_tokens=12),
                               policy=PolicySettings(forbid=["kv_cache_dtype=fp8*"]))
    report = asyncio.run(compare(ref, [_chat_job(tmp_path, data, "--perturb", "0.6"),
                                       _chat_job(tmp_path, data, "--delay", "0.01"), fp8],
                                 settings=settings, out_dir=tmp_path / "compare"))
    verdicts = [r.verdict for r in report.rows]
    assert verdicts == ["pass", "fail", "pass", "rejected"]
    out = tmp_path / "compare-report.html"
    harvest("report", str(tmp_path / "compare"), "-o", str(out))
    doc = json.loads((tmp_path / "compare" / "compare.json").read_text())
    with Browser.start(tmp_path / "chromium") as browser:
        page = browser.open(out)
        shown = check_page(page, out, doc, {"metrics"}, tmp_path)
        shown_verdicts = page.evaluate("[...document.querySelectorAll('table[data-table=rows] [data-verdict]')]"
                                       ".map(e => e.dataset.verdict)")
    assert shown_verdicts == verdicts
    assert any(p.endswith(".quality.metrics.exact_match.low") for p, _ in shown["numbers"])
    for label in ("floor", "candidate-1", "candidate-2", "candidate-3"):
        assert label in shown["charts"]["metrics"]["text"]


def test_harvest_run_prints_its_report(tmp_path: Path):
    job = _chat_job_file(tmp_path, _prompts(tmp_path / "in.jsonl", 20))
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}
    proc = harvest("run", str(job), "--no-live", env=env)
    out = tmp_path / "run" / "report.html"
    assert f"report: {out}" in proc.stdout.splitlines()
    for private in (out, tmp_path / "run" / "timeline.json"):  # private, like every file of a run folder
        assert private.stat().st_mode & 0o777 == 0o600, private
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>") and 'data-chart="over-time"' in text and "<script" not in text


def test_report_refuses_a_folder_of_another_kind(tmp_path: Path):
    proc = harvest("report", str(tmp_path), check=False)
    assert proc.returncode == 2
    assert str(tmp_path) in proc.stderr and "tune.json" in proc.stderr


def test_run_report_shows_skip_reasons_and_settings_as_tables(tmp_path: Path):
    """A run with rows of an unexpected shape and broken lines (the chat stand-in generates the
    rest): the report lists the skip reasons with their counts, an example row and the fix, beside
    the failures, and the sampling and server settings as tables, in Chromium."""
    data = tmp_path / "in.jsonl"
    good = [json.dumps({"id": f"r{i}", "prompt": f"Tell me about item {i}."}) for i in range(16)]
    odd = [json.dumps({"id": f"q{i}", "question": f"Why {i}?"}) for i in range(5)]
    data.write_text("\n".join(good + odd + ['{"id": "broken", "prompt": '] * 2) + "\n")
    job = _chat_job_file(tmp_path, data)
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}
    proc = harvest("run", str(job), "--no-live", env=env)
    assert "skipped 5: no 'prompt', 'messages' or 'conversations' field" in proc.stdout, proc.stdout
    run_dir = tmp_path / "run"
    out = tmp_path / "skips.html"
    harvest("report", str(run_dir), "-o", str(out))
    status = json.loads(harvest("status", str(run_dir), "--json").stdout)
    assert status["counts"]["skipped"] == 7
    with Browser.start(tmp_path / "chromium") as browser:
        page = browser.open(out)
        shown = check_page(page, out, status, {"status"}, tmp_path)
        tables = page.evaluate("""Object.fromEntries([...document.querySelectorAll('table[data-table]')].map(
            t => [t.dataset.table, [...t.querySelectorAll('tbody tr')].map(
                r => [...r.querySelectorAll('td')].map(c => c.innerText))]))""")
        visible = page.evaluate("document.querySelector('table[data-table=\"skipped\"]').getBoundingClientRect().height")
    skipped = tables["skipped"]
    assert visible > 0
    by_class = {row[0]: row for row in skipped}
    shape, broken = by_class["shape"], by_class["input"]
    assert shape[1] == "5" and "no 'prompt', 'messages' or 'conversations' field; the row has 'id', 'question'" \
        in shape[2] and shape[3].endswith("in.jsonl:17") and "prompt_field" in shape[4], shape
    assert broken[1] == "2" and broken[2] == "bad JSON: Expecting value" and broken[3].endswith("in.jsonl:22"), broken
    assert {"skipped_reasons.0.count", "skipped_reasons.1.count"} <= {p for p, _ in shown["numbers"]}
    # the settings, one row each, no raw JSON
    sampling = {r[0]: r[1] for r in tables["sampling"]}
    assert sampling["max_tokens"] == "8" and sampling["temperature"] == "0.0", sampling
    server = {r[0]: r[1] for r in tables["server-settings"]}
    assert server["engine"] == "command" and server["max_running_requests"] == "4", server
    assert "tp" not in server and "base_url" not in server, server  # they mean nothing for a command engine
    # the launch's pid as its launch record holds it, as the process table prints it (no separator)
    record = json.loads((run_dir / "server" / "launch.json").read_text())["record"]
    pids = [row[4] for row in tables["launches"]]
    assert pids == [str(record["pid"])], (pids, record["pid"])
    assert "{" not in "".join([*server.values(), *sampling.values()]).replace("{host}", "").replace("{port}", "")


def test_run_report_of_an_endpoint_shows_its_settings_and_the_truncation_note(tmp_path: Path):
    """A run against an endpoint harvest did not launch (the chat stand-in, started here), whose every
    answer stops at max_tokens: in Chromium the server settings list only what applies to an
    endpoint (no port, ready_timeout or tp), an amber note says that most answers were cut, and the
    latency chart's log axis reads in plain seconds. The launches table of a managed run prints its
    pid without a thousands separator."""
    import urllib.request

    port = engines.free_port()
    engine = subprocess.Popen([sys.executable, str(CHAT_ENGINE), "--port", str(port), "--served", "chat-model"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                assert time.monotonic() < deadline, "the chat stand-in did not start within 30 s"
                time.sleep(0.1)
        data = _prompts(tmp_path / "in.jsonl", 12)
        job = tmp_path / "job.toml"
        job.write_text(f'[server]\nengine = "openai"\nbase_url = "http://127.0.0.1:{port}"\nmodel = "chat-model"\n'
                       f'[data]\npath = {json.dumps(str(data))}\n[sampling]\nmax_tokens = 4\n'
                       f'[output]\ndir = {json.dumps(str(tmp_path / "run"))}\n')
        env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}
        harvest("run", str(job), "--no-live", env=env)
    finally:
        os.killpg(engine.pid, signal.SIGTERM)  # the stand-in this test started, by its group
        engine.wait(timeout=30)
    out = tmp_path / "endpoint.html"
    harvest("report", str(tmp_path / "run"), "-o", str(out))
    status = json.loads(harvest("status", str(tmp_path / "run"), "--json").stdout)
    assert status["counts"]["truncated"] == 12
    with Browser.start(tmp_path / "chromium") as browser:
        page = browser.open(out)
        shown = check_page(page, out, status, {"status", "latency"}, tmp_path)
        settings = page.evaluate("""[...document.querySelectorAll('table[data-table="server-settings"] tbody tr')]
            .map(r => [...r.querySelectorAll('td')].map(c => c.innerText))""")
        note = page.evaluate("""(() => { const n = document.querySelector('[data-note="mostly-truncated"]');
            if (!n) return null; const r = n.getBoundingClientRect();
            return {text: n.innerText, height: r.height, color: getComputedStyle(n).color}; })()""")
        # the quantile labels on the latency chart, each with its box and the chart's
        labels = page.evaluate("""(() => { const svg = document.querySelector('figure[data-chart="latency"] svg');
            const box = r => ({left: r.left, top: r.top, right: r.right, bottom: r.bottom});
            return {svg: box(svg.getBoundingClientRect()), marks: [...svg.querySelectorAll('text')]
                .filter(t => /^p\\d+$/.test(t.textContent.trim()))
                .map(t => ({label: t.textContent.trim(), ...box(t.getBoundingClientRect())}))}; })()""")
    assert dict(settings) == {"engine": "openai", "base_url": f"http://127.0.0.1:{port}", "model": "chat-model"}
    assert note is not None and note["height"] > 0, note
    assert note["text"].startswith("12 of 12 answers (100%) stopped at max_tokens"), note
    assert note["color"] == "rgb(154, 103, 0)", note  # amber (.warn), not the red of a failure
    latency = shown["charts"]["latency"]["text"]
    assert "×" not in latency and "10^" not in latency and "p50" in latency, latency
    # p50 and p99 drawn, each label whole inside the chart (not clipped at its edge)
    assert sorted(m["label"] for m in labels["marks"]) == ["p50", "p99"], labels
    frame = labels["svg"]
    for mark in labels["marks"]:
        assert mark["right"] > mark["left"] and mark["bottom"] > mark["top"], mark
        assert (frame["left"] <= mark["left"] and mark["right"] <= frame["right"]
                and frame["top"] <= mark["top"] and mark["bottom"] <= frame["bottom"]), (mark, frame)
