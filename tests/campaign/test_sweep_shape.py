"""The shape of ``campaign/sweep`` and of the commands over it: the launch-and-judge machinery
lives in modules of its own that compare and tune both use, neither job (nor its command) imports
the other's, and the two reports share one base type while their JSON documents keep the fields,
in the order, that ``harvest report`` and earlier folders read."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import grimp
import pytest

from harvest.campaign.sweep.compare import CompareReport, CompareRow
from harvest.campaign.sweep.launch import Launch
from harvest.campaign.sweep.report import SweepReport
from harvest.campaign.sweep.tune import TrialResult, TuneReport, write_results
from harvest.report.compare import compare_page
from harvest.report.tune import tune_page
from harvest.stops import StopReport

#: (importer, imported) pairs that must have no import chain between them, lazy imports included.
FORBIDDEN = (
    ("harvest.campaign.sweep.tune", "harvest.campaign.sweep.compare"),
    ("harvest.campaign.sweep.compare", "harvest.campaign.sweep.tune"),
    ("harvest.cli.compare", "harvest.campaign.sweep.tune"),
    ("harvest.cli.compare", "harvest.cli.tune"),
    ("harvest.cli.tune", "harvest.cli.compare"),
    ("harvest.cli.tune", "harvest.campaign.sweep.compare"),
)
#: What both jobs share, imported by each.
SHARED = ("harvest.campaign.sweep.launch", "harvest.campaign.sweep.bench", "harvest.campaign.sweep.report")


def chains(graph: grimp.ImportGraph, pairs: tuple[tuple[str, str], ...]) -> list[tuple[str, ...]]:
    """Every import chain found from an importer to what it must not reach."""
    found = []
    for importer, imported in pairs:
        chain = graph.find_shortest_chain(importer=importer, imported=imported)
        if chain is not None:
            found.append(tuple(chain))
    return found


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("harvest", cache_dir=None)


def test_no_job_and_no_command_imports_the_other(graph: grimp.ImportGraph):
    assert chains(graph, FORBIDDEN) == []


def test_both_jobs_use_the_shared_machinery(graph: grimp.ImportGraph):
    for job in ("harvest.campaign.sweep.compare", "harvest.campaign.sweep.tune"):
        for shared in SHARED:
            assert graph.direct_import_exists(importer=job, imported=shared), (job, shared)
    for command in ("harvest.cli.compare", "harvest.cli.tune"):
        assert graph.direct_import_exists(importer=command, imported="harvest.cli.sweep_render")
        assert graph.direct_import_exists(importer=command, imported="harvest.campaign.sweep.tune_file")


def test_the_chain_check_finds_a_planted_lazy_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The check above can fail: a tune module that imports compare inside a function is caught."""
    pkg = tmp_path / "plantedsweep"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "compare.py").write_text("X = 1\n")
    (pkg / "tune.py").write_text("def f():\n    from plantedsweep.compare import X\n    return X\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    planted = grimp.build_graph("plantedsweep", cache_dir=None)
    assert chains(planted, (("plantedsweep.tune", "plantedsweep.compare"),)) == [
        ("plantedsweep.tune", "plantedsweep.compare")]


def test_the_reports_share_one_base_and_declare_only_their_own_fields():
    shared = {f.name for f in fields(SweepReport)}
    assert {"out_dir", "reference", "prompts", "floor_source", "reused_reference", "launches", "notes"} <= shared
    for cls, own in ((CompareReport, {"rows"}), (TuneReport, {"trials", "aborted", "floor"})):
        assert issubclass(cls, SweepReport)
        assert set(cls.__annotations__) == own, cls  # the shared fields are declared once, in the base
        assert {f.name for f in fields(cls)} == shared | own


CLEAN = StopReport("/o/launches/00-reference/server", "clean", (), False, total_s=0.5)
DIRTY = StopReport("/o/launches/01-candidate-1/server", "dirty", (), True, total_s=2.5,
                   problems=("pid 7 outlived the stop",))
REF = Launch("reference", "/o/launches/00-reference/server", 1.5, 4096, CLEAN)
BAD = Launch("candidate-1", "/o/launches/01-candidate-1/server", 2.0, None, DIRTY, "a probe request failed: x",
             "request")
LAUNCH_DOC = {"label": "reference", "run_dir": "/o/launches/00-reference/server", "ready_s": 1.5,
              "kv_capacity_tokens": 4096, "error": None, "reason": None, "memory_bound": False,
              "stop": {"verdict": "clean", "total_s": 0.5, "escalated": False, "problems": []}}


def _shared(out_dir: Path) -> dict:
    return dict(out_dir=out_dir, reference={"engine": "vllm", "model": "m"}, prompts=8,
                floor_source="second launch", reused_reference=True, launches=(REF, BAD),
                notes=("the stop of candidate-1 was dirty",))


def test_compare_json_keeps_its_fields_and_order_and_harvest_report_reads_it(tmp_path: Path):
    report = CompareReport(rows=(CompareRow("floor", {}, "pass", REF),
                                 CompareRow("candidate-2", {"dtype": "half"}, "rejected", reasons=("forbidden",))),
                           **_shared(tmp_path))
    doc = report.to_dict()
    assert list(doc) == ["schema", "out_dir", "reference", "prompts", "floor_source", "reused_reference", "passed",
                         "rows", "launches", "notes"]
    assert doc["schema"] == "harvest.compare/1" and doc["out_dir"] == str(tmp_path) and doc["passed"] is False
    assert doc["rows"][0] == {"label": "floor", "settings": {}, "verdict": "pass", "reasons": [],
                              "launch": LAUNCH_DOC, "quality": None, "gate": None}
    assert doc["launches"][0] == LAUNCH_DOC and list(doc["launches"][0]) == list(LAUNCH_DOC)
    assert doc["launches"][1]["stop"]["problems"] == ["pid 7 outlived the stop"]
    assert doc["notes"] == ["the stop of candidate-1 was dirty"]
    (tmp_path / "compare.json").write_text(json.dumps(doc, indent=2))
    _, _, sections = compare_page(tmp_path)
    page = "".join(sections)
    assert "candidate-2" in page and "rejected" in page and "the stop of candidate-1 was dirty" in page


def test_tune_json_keeps_its_fields_and_order_and_harvest_report_reads_it(tmp_path: Path):
    trials = (TrialResult(1, "01-job", {}, "pass", (), True, REF),
              TrialResult(3, "03-ctx_size-16384", {"ctx_size": 16384}, "skipped", ("needs at least trial 2",)))
    report = TuneReport(trials=trials, aborted=True, **_shared(tmp_path))
    json_path, csv_path = write_results(report)
    doc = json.loads(json_path.read_text())
    assert list(doc) == ["schema", "out_dir", "reference", "prompts", "floor_source", "floor", "reused_reference",
                         "aborted", "best", "trials", "launches", "notes"]
    assert doc["schema"] == "harvest.tune/1" and doc["aborted"] is True and doc["best"] is None
    assert list(doc["trials"][0]) == ["index", "label", "overrides", "verdict", "reasons", "is_reference", "launch",
                                      "quality", "gate", "throughput", "server"]
    assert doc["trials"][0]["launch"] == LAUNCH_DOC and doc["launches"][0] == LAUNCH_DOC
    assert csv_path.read_text().splitlines()[0].startswith("trial,settings,reference,kv_tokens,")
    _, subtitle, sections = tune_page(tmp_path)
    page = "".join(sections)
    assert "2 trials" in subtitle and "skipped" in page and "the stop of candidate-1 was dirty" in page


def test_the_tune_page_counts_every_verdict_a_trial_can_get(tmp_path: Path):
    """One trial of each verdict (an "unsupported" one included: a setting this machine cannot run):
    the page's count line names each once."""
    from harvest.campaign.sweep.report import TRIAL_VERDICTS

    trials = tuple(TrialResult(i + 1, f"{i + 1:02d}-t", {}, verdict) for i, verdict in enumerate(TRIAL_VERDICTS))
    write_results(TuneReport(trials=trials, aborted=False, **_shared(tmp_path)))
    page = "".join(tune_page(tmp_path)[2])
    for verdict in TRIAL_VERDICTS:
        assert f"1 {verdict}" in page, verdict
