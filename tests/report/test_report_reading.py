"""What a reader of the run report sees: the latency and length table says its units; a length
histogram whose answers all have one length (every answer ran to max_tokens) is a bar on an axis of
at least a decade, not a fill of the whole width; in "requests in flight", the "sent" line is drawn
above "claimed ahead" (dashed), so equal values never hide it. The page comes from a real run on
llama-server; the histogram is read from the figure itself."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from harvest.report import charts
from tests import harvest_process
from tests.engines import served_model


def test_one_length_is_a_bar_on_a_decade():
    edges = [0.0, 1.0, 1.19, 1.42, 1.69, 2.0, 2.4, 2.85, 3.4, 4.0, 4.8, 5.7, 6.8, 8.0, 9.6, 11.4, 13.6, 16.2, 19.3,
             23.0, 27.4, 32.6, 38.8, 46.2, 55.0, 65.4]
    counts = [0] * len(edges)
    counts[edges.index(46.2)] = 82  # every answer 48 tokens: one bin
    fig = charts.histogram_figure([("truncated", edges, counts)], title="t", xlabel="tokens (log)",
                                  marks=[(48.0, "max_tokens 48")])
    lo, hi = fig.axes[0].xlim
    assert hi / lo >= charts.MIN_SPAN * 0.999, (lo, hi)
    assert lo < 46.2 and hi > 55.0


def test_the_run_page_says_units_and_keeps_sent_visible(tmp_path: Path, llama_server):
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"Tell me about {i}."}) + "\n" for i in range(60)))
    out = harvest_process.run([sys.executable, "-m", "harvest", "run", "--engine", "openai", "--base-url",
                          llama_server.url + "/v1", "--model", served_model(llama_server.url), "--data", str(data),
                          "--out", str(tmp_path / "run"), "--max-tokens", "24", "--concurrency", "4",
                          "--set", "run.progress_interval=0.2", "--no-live"],
                              capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout + out.stderr
    html = (tmp_path / "run" / "report.html").read_text()
    header = re.search(r'<table[^>]*data-name="distributions".*?</tr>', html, re.S) or \
        re.search(r"<th>measure</th>.*?</tr>", html, re.S)
    assert header and "<th>unit</th>" in header.group(0), html[:2000]
    assert re.search(r"<td>latency \(from sent\)</td><td>seconds</td>", html)
    assert re.search(r"<td>output tokens \((done|truncated)\)</td><td>tokens</td>", html)
    sent, ahead = html.find('id="line: sent (on the wire)"'), html.find('id="line: claimed ahead (harvest&#39;s queue)"')
    if ahead < 0:
        ahead = html.find("id=\"line: claimed ahead (harvest's queue)\"")
    assert sent >= 0 and ahead >= 0, "the over-time panel lost its lines"
    assert sent > ahead, "sent is drawn before claimed ahead: an equal claimed-ahead line hides it"
