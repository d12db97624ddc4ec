"""The probe set: a deterministic, seeded, spread-out draw from the job's dataset plus an extra file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harvest.config import DataConfig
from harvest.errors import ConfigError
from harvest.quality.probe import ProbePrompt, prompt_ids_digest, select_prompts


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def data(tmp_path: Path) -> DataConfig:
    rows = [{"id": f"q{i}", "prompt": f"Question {i}?"} for i in range(200)]
    rows.insert(50, {"id": "q7", "prompt": "a duplicate id"})
    rows.insert(60, {"id": "broken"})  # no prompt: a skipped row
    return DataConfig(path=str(write(tmp_path / "in.jsonl", rows)), id_field="id")


def test_draw_is_deterministic_spread_and_seeded(data):
    a = select_prompts(data, n=20, seed=0)
    b = select_prompts(data, n=20, seed=0)
    c = select_prompts(data, n=20, seed=1)
    assert [p.id for p in a] == [p.id for p in b]
    assert len({p.id for p in a}) == 20
    assert {p.id for p in a} != {p.id for p in c}
    positions = sorted(int(p.id[1:]) for p in a)
    assert positions[0] < 60 and positions[-1] > 140  # spread over the file, not its head
    assert a[0].messages == (("user", f"Question {a[0].id[1:]}?"),)
    # a smaller draw with the same seed is a prefix of a larger one (the same hash order)
    assert [p.id for p in select_prompts(data, n=5, seed=0)] == [p.id for p in a[:5]]


def test_limit_of_the_job_is_honoured(tmp_path):
    rows = [{"id": f"q{i}", "prompt": f"Question {i}?"} for i in range(100)]
    data = DataConfig(path=str(write(tmp_path / "in.jsonl", rows)), id_field="id", limit=10)
    drawn = select_prompts(data, n=50, seed=3)
    assert sorted(int(p.id[1:]) for p in drawn) == list(range(10))


def test_extra_file_is_appended_and_multi_turn_is_probed_at_its_last_user_turn(data, tmp_path):
    extra = write(tmp_path / "extra.jsonl", [
        {"id": "hard-1", "messages": [
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": "first"}, {"role": "assistant", "content": "original answer"},
            {"role": "user", "content": "second"}, {"role": "assistant", "content": "to be regenerated"}]},
        {"id": "q3", "prompt": "Question 3?"},  # also drawable from data: counted once
    ])
    drawn = select_prompts(data, n=4, seed=0, extra=extra)
    assert [p.id for p in drawn][:4] == [p.id for p in select_prompts(data, n=4, seed=0)]
    hard = next(p for p in drawn if p.id == "hard-1")
    assert hard.messages == (("system", "Be terse."), ("user", "first"), ("assistant", "original answer"),
                             ("user", "second"))
    assert len([p for p in drawn if p.id == "q3"]) == 1
    only_extra = select_prompts(None, n=0, extra=extra)
    assert [p.id for p in only_extra] == ["hard-1", "q3"]


def test_empty_probe_set_and_missing_data_are_config_errors(tmp_path):
    with pytest.raises(ConfigError):
        select_prompts(None, n=5)
    with pytest.raises(ConfigError):
        select_prompts(None, n=0)


def test_digest_changes_with_content():
    a = [ProbePrompt("x", (("user", "hello"),))]
    b = [ProbePrompt("x", (("user", "hello!"),))]
    assert prompt_ids_digest(a) == prompt_ids_digest(list(a))
    assert prompt_ids_digest(a) != prompt_ids_digest(b)
    assert ProbePrompt.from_json(a[0].to_json()) == a[0]
