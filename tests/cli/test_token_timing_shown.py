"""Streamed answers' timings where a person reads them: ``harvest status`` prints TTFT, TPOT and ITL
(not only ``--json``), the panel's tokens row has ITL, a time under a millisecond reads in µs (never
"0 ms"), and the report's histogram draws values below its lowest edge as one bin, not as a wide
bar a decade across. On a run folder written by the timeline's own recorder; no engine."""

from __future__ import annotations

import io
import re

from click.testing import CliRunner
from rich.console import Console

from harvest.campaign.outputs.progress import Progress
from harvest.campaign.outputs.timeline import STREAM, Histogram, Timeline
from harvest.cli.main import cli
from harvest.cli.panel import RunPanel, stream_line
from harvest.report import charts, render_report
from tests.campaign.test_export import build_run


def test_status_prints_ttft_tpot_and_itl_with_the_digits_they_need(tmp_path):
    run_dir = tmp_path / "run"
    build_run(run_dir)
    timeline = Timeline.open(run_dir)
    for i in range(20):  # a fast engine: TPOT and ITL under a millisecond
        timeline.stream_times(0.21 + i * 0.001, 0.0008, [0.0008] * 9)
    timeline.close("finished")
    out = CliRunner().invoke(cli, ["status", str(run_dir)], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    (line,) = [ln for ln in out.output.splitlines() if ln.startswith("tokens (streamed): ")]
    assert re.search(r"TTFT p50 2\d\d ms  p90 2\d\d ms   TPOT p50 8\d\d µs  p90 8\d\d µs   ITL p50 8\d\d µs", line), line


def test_the_panel_shows_itl_and_short_times_keep_their_digits(tmp_path):
    progress = Progress(tmp_path, total=10, already_final=0, watch=None)
    progress.begin("generating")
    for _ in range(4):
        progress.record("done", 10, 10)
        progress.stream_times(0.3, 0.0009, [0.0009, 0.0011, 0.0010])
    view = progress.snapshot()["stream"]
    assert stream_line(view) == "TTFT p50 300 ms  p90 300 ms   TPOT p50 900 µs  p90 900 µs   ITL p50 1.0 ms  p90 1.1 ms"
    console = Console(file=io.StringIO(), width=130, force_terminal=True, record=True)
    panel = RunPanel(console, live=False)
    progress.watch = panel
    panel.opened(progress.view)
    console.print(panel)
    assert "ITL p50 1.0 ms" in console.export_text()
    from harvest.cli.panel import short_time

    assert [short_time(s) for s in (2.5, 0.21, 0.0042, 0.0008, 0.00005)] == [
        "2.50 s", "210 ms", "4.2 ms", "800 µs", "50 µs"]


def test_the_report_draws_ttft_tpot_and_itl_and_tables_them(tmp_path):
    run_dir = tmp_path / "run"
    build_run(run_dir)
    timeline = Timeline.open(run_dir)
    for i in range(20):
        timeline.stream_times(0.21 + i * 0.001, 0.0008, [0.0008] * 9)
    timeline.close("finished")
    page, _ = render_report(run_dir)
    table = page[page.index('data-table="distributions"'):]
    table = table[:table.index("</table>")]
    cells = [re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in table.split("<tr>")]
    got = {row[0]: row[3] for row in cells if row}  # the measure: its p50
    assert (got["time to first token (TTFT)"][:3], got["time per output token (TPOT)"], got["between tokens (ITL)"]) \
        == ("0.2", "0.0008000", "0.0008000"), got
    chart = page[page.index('data-chart="token-timing"'):]
    chart = chart[:chart.index("</figure>")]
    legend = re.findall(r">\s*(TTFT|TPOT|ITL) \((\d+)\)</text>", chart)  # a legend entry: the series, its count
    assert legend == [("TTFT", "20"), ("TPOT", "20"), ("ITL", "180")], legend  # before: TTFT and TPOT only


def test_values_below_the_lowest_edge_are_one_bin_wide_in_the_report():
    lo, bins, ratio = STREAM
    h = Histogram(lo, bins, ratio=ratio)
    for _ in range(5):
        h.add(0.00002)  # 20 µs: below the histogram's lowest edge (0.1 ms)
    fig = charts.histogram_figure([("TPOT", h.edges(), h.counts)], title="t", xlabel="seconds (log)")
    (bar,) = [m for m in fig.axes[0].marks if m.kind == "stairs"]
    edges = bar.edges
    assert edges[-1] == h.lo and edges[0] >= h.lo / h.ratio * 0.999, edges  # before: from lo / 10
