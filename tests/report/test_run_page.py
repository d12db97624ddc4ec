"""The run report's page as HTML, without a browser: pids and ports as the process table prints
them (no thousands separator), and the amber note that comes when more than half the answers
stopped at max_tokens (none at half or under). The folders are real ledgers (tests/campaign/
test_export.py's items and outputs); the browser checks are tests/report/test_report_browser.py's."""

from __future__ import annotations

from pathlib import Path

import pytest

from harvest.campaign.outputs.status import run_status
from harvest.ledger import Completion, Ledger, Status
from harvest.report.run import launches_section, run_page, settings_table
from tests.campaign.test_export import SETTINGS, item, output


def test_a_pid_and_a_port_are_printed_without_separators():
    launch = {"session": 0, "launched_at": 1_700_000_000.0, "engine": "vllm", "engine_version": "0.11.0",
              "pid": 19548, "ready_s": 212.8, "kv_capacity_tokens": 1_048_576, "stop": None}
    html = launches_section([launch])
    assert '<td class="num">19548</td>' in html and "19,548" not in html, html
    assert "1,048,576" in html  # a count keeps its separators
    settings = settings_table({"engine": "vllm", "port": 18123, "host": "127.0.0.1"}, name="server-settings")
    assert "<td>port</td><td>18123</td>" in settings and "18,123" not in settings, settings


def _run(run_dir: Path, done: int, truncated: int, failed: int = 0) -> str:
    """A finished run of ``done`` + ``truncated`` answers (and ``failed`` items); its page's HTML."""
    items = [item(f"i{n}", n + 1, ("user", f"question {n}")) for n in range(done + truncated + failed)]
    with Ledger.open(run_dir, settings_hash=SETTINGS) as ledger:
        ledger.ingest(items)
        assert len(ledger.claim(len(items))) == len(items)
        answers = items[:done + truncated]
        ledger.complete([
            Completion(it.id, output(it, ["a cut answer" if cut else "an answer"], finish="length" if cut else "stop"),
                       status=Status.TRUNCATED if cut else Status.DONE, finish_reason="length" if cut else "stop",
                       prompt_tokens=10, completion_tokens=8)
            for n, it in enumerate(answers) for cut in [n >= done]])
        for it in items[done + truncated:]:
            assert ledger.fail(it.id, "HTTP 400: prompt is too long for the context", "http_400")
    _, _, sections = run_page(run_dir)
    return "".join(sections)


@pytest.mark.parametrize("done, truncated, failed, note", [
    (3, 3, 0, None),  # exactly half: no note
    (4, 3, 0, None),
    (0, 0, 2, None),  # nothing answered
    (2, 3, 0, "3 of 5 answers (60%) stopped at max_tokens"),  # just over half
    (1, 2, 6, "2 of 3 answers (67%) stopped at max_tokens"),  # failed items are not answers
    (0, 4, 0, "4 of 4 answers (100%) stopped at max_tokens"),
])
def test_the_amber_note_comes_only_when_more_than_half_the_answers_hit_max_tokens(tmp_path, done, truncated,
                                                                                   failed, note):
    html = _run(tmp_path / "run", done, truncated, failed)
    st = run_status(tmp_path / "run")
    assert (st.counts[Status.DONE], st.counts[Status.TRUNCATED], st.counts[Status.FAILED]) == (done, truncated, failed)
    assert st.totals.ok and 'data-json="totals.ok">OK<' in html  # the counts add up either way
    if note is None:
        assert 'data-note="mostly-truncated"' not in html
        return
    start = html.index('<p class="warn" data-note="mostly-truncated">')
    shown = html[start:html.index("</p>", start)]
    assert shown.endswith(f">{note}: their text is cut. Raise [sampling] max_tokens, or find why the model does "
                          f"not stop (its chat template, its stop tokens)."), shown
