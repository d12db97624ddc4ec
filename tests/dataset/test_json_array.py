"""Streamed JSON arrays: elements split across chunks, malformed elements skipped, truncation seen."""

from __future__ import annotations

import io
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harvest.config import DataConfig
from harvest.dataset import Item, Row, Skipped, iter_items, read_json
from harvest.dataset.jsonarray import NotAnArray, split_array
from harvest.errors import ConfigError


def test_elements_and_start_lines(tmp_path):
    p = tmp_path / "d.json"
    p.write_text('[\n  {"prompt": "a"},\n  {"prompt": "b, ] } tricky \\" quote"},\n\n  {"prompt": "c"}\n]\n')
    rows = list(read_json(p, chunk=4))  # tiny chunks: every boundary case is crossed
    assert [(r.line, r.data["prompt"]) for r in rows] == [  # type: ignore[union-attr]
        (2, "a"), (3, 'b, ] } tricky " quote'), (5, "c")]


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, 1 << 20])
def test_chunk_size_never_changes_the_result(chunk):
    values = [{"prompt": "x" * n, "n": n, "nested": [[{"k": "]"}]], "esc": "\\\\\""} for n in range(30)]
    data = json.dumps(values, indent=1).encode()
    out = list(split_array(io.BytesIO(data), "d.json", chunk))
    assert [json.loads(text) for _, text in out] == values


def test_malformed_elements_are_skipped_and_the_rest_read(tmp_path):
    huge = "y" * (1024 * 1024)
    p = tmp_path / "d.json"
    p.write_bytes(
        b'\xef\xbb\xbf[\r\n'
        b'{"prompt": "good"},\r\n'           # line 2
        b'{"prompt": 1,, "x": 2},\r\n'       # line 3: bad JSON inside a delimited element
        b'{"prompt": "bad \xff utf8"},\r\n'  # line 4
        b'42,\r\n'                           # line 5: not an object
        b'{"messages": []},\r\n'             # line 6: empty conversation
        + json.dumps({"prompt": huge}).encode() + b',\r\n'  # line 7: 1 MB prompt
        b'{"prompt": "last"}\r\n'            # line 8
        b']\r\n'
    )
    out = list(iter_items(DataConfig(path=str(p))))
    items = [r for r in out if isinstance(r, Item)]
    skipped = {r.line: r.reason for r in out if isinstance(r, Skipped)}
    assert [i.source_line for i in items] == [2, 7, 8]
    assert items[1].user_turns() == (huge,)
    assert sorted(skipped) == [3, 4, 5, 6]
    assert skipped[3].startswith("bad JSON")
    assert "UTF-8" in skipped[4]
    assert "JSON int" in skipped[5]
    assert "empty conversation" in skipped[6]


def test_truncated_array_is_reported(tmp_path):
    p = tmp_path / "d.json"
    p.write_text('[{"prompt": "a"}, {"prompt": "b"')
    out = list(read_json(p))
    assert isinstance(out[0], Row)
    assert isinstance(out[-1], Skipped) and "no closing ']'" in out[-1].reason


def test_trailing_comma_and_trailing_data_are_reported(tmp_path):
    p = tmp_path / "d.json"
    p.write_text('[{"prompt": "a"},]\n{"more": 1}')
    out = list(read_json(p))
    assert isinstance(out[0], Row)
    reasons = [r.reason for r in out if isinstance(r, Skipped)]
    assert any("trailing comma" in r for r in reasons)
    assert any("after the closing ']'" in r for r in reasons)


def test_json_file_holding_json_lines_is_read_as_such(tmp_path):
    p = tmp_path / "d.json"
    p.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    assert [r.data["prompt"] for r in read_json(p)] == ["a", "b"]  # type: ignore[union-attr]


def test_other_top_level_values_are_a_config_error(tmp_path):
    p = tmp_path / "d.json"
    p.write_text('"just a string"')
    with pytest.raises(ConfigError, match="expected a JSON array"):
        list(read_json(p))
    with pytest.raises(NotAnArray):
        list(split_array(io.BytesIO(b"  {"), "x"))


def test_empty_file_and_empty_array_hold_no_rows(tmp_path):
    (tmp_path / "a.json").write_text("")
    (tmp_path / "b.json").write_text(" [ ] ")
    assert list(read_json(tmp_path / "a.json")) == []
    assert list(read_json(tmp_path / "b.json")) == []


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.integers(min_value=2, max_value=16))
def test_fuzz_split_array_never_raises_and_ignores_chunking(body, chunk):
    """Random bytes after '[': no exception, and the same pieces whatever the chunk size."""
    out = list(split_array(io.BytesIO(b"[" + body), "f.json", chunk))
    assert out == list(split_array(io.BytesIO(b"[" + body), "f.json", 1))
    for piece in out:
        assert isinstance(piece, Skipped) or (isinstance(piece, tuple) and piece[0] >= 1)


class _CountingStream(io.BytesIO):
    def __init__(self, data: bytes):
        super().__init__(data)
        self.reads = 0

    def read(self, n: int = -1) -> bytes:  # type: ignore[override]
        self.reads += 1
        return super().read(n)


def test_an_element_spanning_many_chunks_is_read_in_a_doubling_buffer():
    # 8 MiB of one element with 4 KiB chunks: fixed-size reads would take ~2,000 reads, each
    # copying everything held so far; a buffer that grows with the element takes ~log2(2,000).
    big = {"id": "big", "prompt": "x" * (8 << 20)}
    data = json.dumps([{"id": "a", "prompt": "p"}, big, {"id": "b", "prompt": "q"}]).encode()
    stream = _CountingStream(data)
    out = list(split_array(stream, "big.json", chunk=4096))
    assert [json.loads(text)["id"] for _, text in out] == ["a", "big", "b"]
    assert json.loads(out[1][1]) == big
    assert stream.reads <= 20, stream.reads
