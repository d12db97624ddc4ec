"""`harvest run`'s input line says where the ids come from: the ledger counts, over the whole input
and across an interrupted ingest, the items known by the user's own id."""

from __future__ import annotations

import json

from harvest.campaign.run.intake import describe_ids
from harvest.config import DataConfig
from harvest.dataset import iter_items
from harvest.ledger import Ledger


def ingest(tmp_path, rows, **data):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = DataConfig(path=str(path), **data)
    with Ledger.open(tmp_path / "run", settings_hash="0" * 32) as ledger:
        report = ledger.ingest(iter_items(config), batch_size=3)
    return config, report


def test_sharegpt_rows_with_ids_are_known_by_them(tmp_path):
    rows = [{"id": f"s{i}", "conversations": [{"from": "human", "value": f"q{i}"}]} for i in range(7)]
    config, report = ingest(tmp_path, rows)
    assert report.own_ids == 7
    assert describe_ids(config, report) == "ids: the rows' 'id' field"


def test_rows_without_ids_use_content_hashes(tmp_path):
    config, report = ingest(tmp_path, [{"prompt": f"q{i}"} for i in range(5)] + ["not an object"])
    assert report.own_ids == 0 and report.skipped == 1
    assert describe_ids(config, report) == "ids: content hashes (no 'id' field)"


def test_a_mix_is_counted_and_id_field_empty_forces_hashes(tmp_path):
    rows = [{"id": "a", "prompt": "x"}, {"prompt": "y"}, {"id": "b", "messages": [{"role": "user", "content": "z"}]}]
    config, report = ingest(tmp_path / "mix", rows)
    assert report.own_ids == 2
    assert describe_ids(config, report) == "ids: the rows' 'id' field (2), content hashes where a row has none (1)"
    config, report = ingest(tmp_path / "hash", rows, id_field="")
    assert report.own_ids == 0
    assert describe_ids(config, report) == 'ids: content hashes (id_field = "")'
    config, report = ingest(tmp_path / "named", [{"key": "k", "prompt": "x"}], id_field="key")
    assert describe_ids(config, report) == "ids: the rows' 'key' field"


def test_an_all_skipped_dataset_does_not_blame_the_id_field(tmp_path):
    """Every row has its qid but none has a prompt: the line says every row was skipped, not that
    the rows lack the id field the user set."""
    rows = [{"qid": f"q{i}", "question": f"what {i}?"} for i in range(4)]
    config, report = ingest(tmp_path, rows, id_field="qid")
    assert report.skipped == 4
    assert describe_ids(config, report) == "ids: none (every row was skipped; [data] id_field 'qid')"
