"""The report's SVG plotter (harvest/report/plot.py): ticks a person reads, text kept as text and
escaped, a line broken where a value is missing, the same figure written as the same bytes, and
figures on one page that never share an id they refer to."""

from __future__ import annotations

import re

from harvest.report import charts
from harvest.report.plot import Axes, Figure, Scale


def test_ticks_are_plain_numbers_at_one_two_five_on_a_log_axis_and_round_steps_on_a_linear_one():
    log = Scale(log=True, lo=0.05, hi=30.0)
    assert [t for _, t in log.ticks(600)] == ["0.05", "0.1", "0.2", "0.5", "1", "2", "5", "10", "20"]
    assert [t for _, t in log.ticks(120)] == ["0.1", "1", "10"]  # too many for its length: decades only
    assert [t for _, t in Scale(lo=0.0, hi=1234.0).ticks(400)] == ["0", "200", "400", "600", "800", "1,000",
                                                                   "1,200"]
    assert [t for _, t in Scale(lo=0.0, hi=0.75).ticks(200, 60)] == ["0.00", "0.25", "0.50", "0.75"]
    scale = Scale(floor=0.0)
    scale.see(0, 4, 10)
    assert scale.limits() == (0.0, 10.5)  # 5 % above the data, none below the floor of bars


def test_a_missing_value_breaks_the_line_and_labels_are_escaped_text():
    fig = Figure(400, 200, axes=[Axes(legend=True, title="a <b> & \u202e")])
    fig.axes[0].line([0, 1, 2, 3, 4], [1, 2, None, 3, 4], color="#000", label="x<y", gid="line: x<y")
    svg = fig.svg()
    (d,) = re.findall(r'<g id="line: x&lt;y"><path d="([^"]+)"', svg)
    assert d.count("M ") == 2 and d.count(" L ") == 2, d  # two runs of two points
    assert ">a &lt;b&gt; &amp; \\u202e</text>" in svg and "\u202e" not in svg
    assert '<g id="legend_1">' in svg and ">x&lt;y</text>" in svg


def test_the_same_figure_is_the_same_bytes_and_two_figures_share_no_clip_id():
    def hist(n: int) -> str:
        return charts.histograms([("all", [0.0, 1.0, 2.0, 4.0], [0, n, 1, 0])], title="t", xlabel="s (log)",
                                 marks=[(1.5, "p50")])
    a, b = hist(3), hist(5)
    assert hist(3) == a
    clips = [set(re.findall(r'clipPath id="([^"]+)"', svg)) for svg in (a, b)]
    assert clips[0] and clips[1] and not clips[0] & clips[1]
    for svg in (a, b):
        assert set(re.findall(r'url\(#([^)]+)\)', svg)) <= set(re.findall(r'clipPath id="([^"]+)"', svg))


def test_each_chart_draws_its_marks_where_its_data_says():
    svg = charts.hbars(["done", "failed"], [30.0, 10.0], ["#1a7f37", "#cf222e"], title="items by status",
                       xlabel="items", notes=["30 (75%)", "10 (25%)"])
    widths = [float(w) for w in re.findall(r'<rect x="[\d.]+" y="[\d.]+" width="([\d.]+)" height="[\d.]+" '
                                           r'fill="#(?:1a7f37|cf222e)"', svg)]
    assert len(widths) == 2 and abs(widths[0] / widths[1] - 3.0) < 0.01, widths
    assert ">30 (75%)</text>" in svg and ">done</text>" in svg
    panels = [{"metric": "mean_kl", "points": [(0.01, 0.005, 0.02, 100.0, "pass", "a", True),
                                               (0.5, None, None, 80.0, "fail", "b", False)],
               "floor": (0.001, 0.0, 0.002), "limit": 0.05}]
    svg = charts.metric_scatter(panels, ylabel="gen tok/s")
    assert svg.count('r="7"') == 1  # the chosen one ringed
    legend = re.findall(r'font-size="8">([^<]+)</text>', svg)
    assert legend == ["noise floor", "gate limit", "pass", "chosen", "fail"], legend
