"""The task check: a user command (JSON Lines in, scores out) or a Python callable scores outputs."""

from __future__ import annotations

import sys
import textwrap

import pytest

from harvest.errors import ConfigError
from harvest.quality.settings import TaskSettings
from harvest.quality.task import run_task

RECORDS = [{"id": "a", "messages": [{"role": "user", "content": "q"}], "output": "yes yes"},
           {"id": "b", "messages": [{"role": "user", "content": "q"}], "output": "no"}]

# Scores an output by how many times it says "yes"; mode "ids" answers {"id", "score"} in reverse order.
SCORER = textwrap.dedent("""
    import json, sys
    rows = [json.loads(line) for line in sys.stdin]
    if sys.argv[1] == "ids":
        for r in reversed(rows):
            print(json.dumps({"id": r["id"], "score": r["output"].split().count("yes")}))
    elif sys.argv[1] == "fail":
        sys.exit("scorer broke")
    else:
        for r in rows:
            print(r["output"].split().count("yes"))
""")


def test_command_scores_in_order_or_by_id():
    assert run_task(TaskSettings(command=[sys.executable, "-c", SCORER, "plain"]), RECORDS) == [2.0, 0.0]
    assert run_task(TaskSettings(command=[sys.executable, "-c", SCORER, "ids"]), RECORDS) == [2.0, 0.0]


def test_a_failing_command_names_itself():
    with pytest.raises(ConfigError) as err:
        run_task(TaskSettings(command=[sys.executable, "-c", SCORER, "fail"]), RECORDS)
    assert "scorer broke" in str(err.value) and "[task]" in str(err.value)


def test_function_scorer(tmp_path, monkeypatch):
    (tmp_path / "my_scorer.py").write_text(
        "def score(records):\n    return [len(r['output']) for r in records]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert run_task(TaskSettings(function="my_scorer:score"), RECORDS) == [7.0, 2.0]
    with pytest.raises(ConfigError):
        run_task(TaskSettings(function="my_scorer:missing"), RECORDS)


def test_settings_refuse_two_scorers_and_a_bad_function_name():
    with pytest.raises(ValueError):
        TaskSettings(command=["x"], function="m:f")
    with pytest.raises(ValueError):
        TaskSettings(function="no_colon")
    assert not TaskSettings().enabled
