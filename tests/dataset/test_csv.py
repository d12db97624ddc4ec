"""CSV reader: header mapping, record start lines (multi-line cells), bad rows skipped."""

from __future__ import annotations

import json

import pytest

from harvest.config import DataConfig
from harvest.dataset import Item, Skipped, iter_items, read_csv
from harvest.errors import ConfigError


def test_rows_map_header_to_cells_with_record_start_lines(tmp_path):
    p = tmp_path / "d.csv"
    p.write_bytes(b'\xef\xbb\xbfid,prompt\r\n1,"first\r\nspans two lines"\r\n2,second\r\n')
    rows = list(read_csv(p))
    assert [(r.line, r.data) for r in rows] == [  # type: ignore[union-attr]
        (2, {"id": "1", "prompt": "first\r\nspans two lines"}),
        (4, {"id": "2", "prompt": "second"}),
    ]


def test_items_with_id_field_and_json_messages_column(tmp_path):
    p = tmp_path / "d.csv"
    msgs = json.dumps([{"role": "user", "content": "from a cell"}])
    p.write_text('key,messages\nk1,"' + msgs.replace('"', '""') + '"\n')
    (item,) = list(iter_items(DataConfig(path=str(p), id_field="key")))
    assert isinstance(item, Item) and item.id == "k1" and item.user_turns() == ("from a cell",)


def test_bad_rows_are_skipped_and_a_big_cell_is_read(tmp_path):
    big = "z" * (1024 * 1024)
    p = tmp_path / "d.csv"
    p.write_bytes(
        b"prompt,extra\n"
        b"ok,1\n"              # line 2
        b"too,many,fields\n"   # line 3
        b"\xff\xfe,1\n"        # line 4: not UTF-8
        b",1\n"                # line 5: empty prompt
        + big.encode() + b",1\n"  # line 6: a 1 MB cell (over the csv module's default limit)
        b"last,1\n"            # line 7
    )
    out = list(iter_items(DataConfig(path=str(p))))
    assert [i.source_line for i in out if isinstance(i, Item)] == [2, 6, 7]
    reasons = {s.line: s.reason for s in out if isinstance(s, Skipped)}
    assert "3 fields, the header has 2" in reasons[3]
    assert "not valid UTF-8" in reasons[4]
    assert "'prompt' is empty" in reasons[5]


def test_tsv_uses_tabs(tmp_path):
    p = tmp_path / "d.tsv"
    p.write_text("prompt\tn\nhello, world\t1\n")
    (item,) = list(iter_items(DataConfig(path=str(p))))
    assert isinstance(item, Item) and item.user_turns() == ("hello, world",)


def test_repeated_header_names_are_a_config_error(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("prompt,prompt\na,b\n")
    with pytest.raises(ConfigError, match="repeated"):
        list(read_csv(p))


def test_empty_file_has_no_rows(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("")
    assert list(read_csv(p)) == []
