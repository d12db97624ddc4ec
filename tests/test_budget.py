"""The suite's time budget (tests/budget.py), on a child pytest run with a planted slow test: over
its budget the run fails on CI naming the budget, and elsewhere only says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import budget

ROOT = Path(__file__).resolve().parents[1]
PLANTED = '''
import time


def test_planted_slow():
    time.sleep(1.0)
'''


def child(tmp_path: Path, *, limit: str, ci: bool, **extra: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_planted.py").write_text(textwrap.dedent(PLANTED))
    env = {k: v for k, v in budget.child_env().items() if k not in ("CI", "PYTEST_ADDOPTS", "HARVEST_NO_SKIPS")}
    env[budget.ENV] = limit
    env.update(extra)
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.conftest", "-q",
                           f"--basetemp={tmp_path / 'child'}", str(tmp_path / "test_planted.py")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_a_run_over_its_budget_fails_on_ci_and_only_warns_elsewhere(tmp_path: Path) -> None:
    record = tmp_path / "times.json"
    failed = child(tmp_path, limit="0.2", ci=True, **{budget.TIMES_ENV: str(record)})
    text = failed.stdout + failed.stderr
    assert failed.returncode == 1, text[-3000:]
    assert "1 passed" in text, text[-3000:]  # the test itself passed: the budget failed the run
    assert "time budget exceeded: the session took " in text, text[-3000:]
    assert f"over its budget of 0.2 s ({budget.ENV}); failing the run (CI)" in text, text[-3000:]
    # the record of where the time went, and the table made of it
    doc = json.loads(record.read_text())
    (nodeid, row), = doc["tests"].items()
    assert nodeid.endswith("test_planted.py::test_planted_slow") and row["seconds"] >= 1.0, doc
    assert doc["session_s"] >= row["seconds"] and doc["workers"] == 1
    table = budget.file_table(doc, at_least_s=0.5)
    assert "test_planted.py` | 1 | 100.0 % | 1 | its module |" in table and "**all**" in table, table
    beside = budget.file_table(doc, at_least_s=0.5, before=doc)
    assert "test_planted.py` | 1 | 100.0 % | 1 | 1 | 1 | its module |" in beside, beside

    # Off CI only a warning; and a budget set where the speed probe takes far longer than here (a
    # machine ever so much slower) is halved here, no more (the lower end of SCALE_RANGE).
    warned = child(tmp_path, limit="0.2", ci=False, **{budget.PROBE_ENV: "1e9"})
    text = warned.stdout + warned.stderr
    assert warned.returncode == 0, text[-3000:]
    assert "time budget exceeded" in text and "on CI this fails the run" in text, text[-3000:]
    assert (f"over its budget of 0.1 s ({budget.ENV} 0.2 s where the speed probe takes 1e+09 ms; here "
            in text and " ms, x0.50); on CI" in text), text[-3000:]


def test_a_bad_budget_is_a_usage_error_naming_the_variable(tmp_path: Path) -> None:
    out = child(tmp_path, limit="two minutes", ci=True)
    assert out.returncode == 4, out.stdout + out.stderr  # pytest's usage error
    assert f"{budget.ENV}='two minutes': give the budget in seconds" in out.stderr, out.stderr


@pytest.mark.parametrize(("elapsed", "limit", "ci", "fails"), [
    (119.9, 120.0, True, None), (120.0, 120.0, True, None), (120.5, 120.0, True, True), (300.0, 120.0, False, False)])
def test_the_verdict_is_over_the_budget_only(elapsed: float, limit: float, ci: bool, fails: bool | None) -> None:
    found = budget.verdict(elapsed, limit, ci=ci)
    assert (found is None) == (fails is None), found
    if found is not None:
        assert found[0] is fails and f"{elapsed - limit:.1f} s over its budget of {limit:g} s" in found[1]


@pytest.mark.parametrize(("set_at", "here", "limit"), [
    (5.0, 5.0, 210.0), (5.0, 10.0, 420.0), (5.0, 2.5, 105.0), (5.0, 1.0, 105.0), (5.0, 100.0, 630.0),
    (None, 3.0, 210.0), (5.0, None, 210.0)])
def test_a_budget_follows_the_machines_speed_within_its_range(set_at: float | None, here: float | None,
                                                               limit: float) -> None:
    assert budget.scaled(210.0, set_at, here) == pytest.approx(limit)
    assert budget.verdict(limit, 210.0, ci=True, set_at_ms=set_at, here_ms=here) is None
    fails, line = budget.verdict(limit + 1, 210.0, ci=True, set_at_ms=set_at, here_ms=here)
    assert fails and f"1.0 s over its budget of {limit:.4g} s" in line, line


def test_the_speed_probe_is_cpu_time_and_a_bad_setting_names_its_variable(monkeypatch) -> None:
    one = budget.speed_probe_ms(rounds=5)
    assert 0.05 < one < 1000, one  # a few milliseconds of CPU a round on the machines seen
    monkeypatch.setenv(budget.PROBE_ENV, "fast")
    with pytest.raises(ValueError, match=f"{budget.PROBE_ENV}='fast': give the speed probe's milliseconds"):
        budget.probe_ms()
    monkeypatch.setenv(budget.PROBE_ENV, " 5.2 ")
    assert budget.probe_ms() == 5.2
