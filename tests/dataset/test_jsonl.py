"""JSON Lines reader: good rows, malformed rows skipped with line and reason, odd encodings, fuzz."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harvest.config import DataConfig
from harvest.dataset import Item, Row, Skipped, iter_items, read_jsonl


def write_lines(path: Path, lines: list[bytes], newline: bytes = b"\n") -> Path:
    path.write_bytes(newline.join(lines) + newline)
    return path


def test_reads_every_row_with_its_line(tmp_path):
    p = write_lines(tmp_path / "d.jsonl", [json.dumps({"prompt": f"q{i}"}).encode() for i in range(5)])
    rows = list(read_jsonl(p))
    assert [r.line for r in rows] == [1, 2, 3, 4, 5]
    assert all(isinstance(r, Row) for r in rows)
    assert rows[3].data == {"prompt": "q3"}


def test_malformed_rows_are_skipped_and_the_rest_read(tmp_path):
    huge = "x" * (1024 * 1024)
    lines = [
        b'{"prompt": "good 1"}',                          # 1
        b'{"prompt": "unterminated',                      # 2 bad JSON
        b'{"other": 1}',                                  # 3 missing field
        b'{"prompt": ["not", "text"]}',                   # 4 mistyped
        b'{"messages": []}',                              # 5 empty conversation
        b'{"prompt": "bad \xff\xfe utf8"}',               # 6 invalid UTF-8
        b"[1, 2]",                                        # 7 not an object
        json.dumps({"prompt": huge}).encode(),            # 8 a 1 MB prompt: fine
        b"",                                              # 9 blank line: not a record
        b'{"messages": [{"role": "assistant", "content": "no user"}]}',  # 10 no user turn
        b'{"prompt": "good 2"}',                          # 11
    ]
    p = write_lines(tmp_path / "d.jsonl", lines)
    out = list(iter_items(DataConfig(path=str(p))))
    by_line = {r.source_line if isinstance(r, Item) else r.line: r for r in out}
    assert sorted(by_line) == [1, 2, 3, 4, 5, 6, 7, 8, 10, 11]
    items = [r for r in out if isinstance(r, Item)]
    assert [i.source_line for i in items] == [1, 8, 11]
    assert items[1].user_turns()[0] == huge
    reasons = {r.line: r.reason for r in out if isinstance(r, Skipped)}
    assert reasons[2].startswith("bad JSON")
    assert "no 'prompt'" in reasons[3]
    assert "'prompt' is list" in reasons[4]
    assert "empty conversation" in reasons[5]
    assert "not valid UTF-8" in reasons[6]
    assert "JSON list, expected an object" in reasons[7]
    assert "starts with assistant" in reasons[10]


def test_bom_and_crlf_are_tolerated(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_bytes(b'\xef\xbb\xbf{"prompt": "a"}\r\n{"prompt": "b"}\r\n')
    items = list(iter_items(DataConfig(path=str(p))))
    assert [i.user_turns() for i in items] == [("a",), ("b",)]  # type: ignore[union-attr]


def test_gzip_file_is_streamed(tmp_path):
    p = tmp_path / "d.jsonl.gz"
    with gzip.open(p, "wb") as f:
        f.write(b'{"prompt": "zipped"}\n')
    items = list(iter_items(DataConfig(path=str(p))))
    assert isinstance(items[0], Item) and items[0].user_turns() == ("zipped",)


def test_ids_are_stable_across_runs_and_duplicates_share_an_id(tmp_path):
    lines = [b'{"prompt": "same"}', b'{"prompt": "other"}', b'{"prompt": "same"}']
    p = write_lines(tmp_path / "d.jsonl", lines)
    first = [i.id for i in iter_items(DataConfig(path=str(p)))]  # type: ignore[union-attr]
    second = [i.id for i in iter_items(DataConfig(path=str(p)))]  # type: ignore[union-attr]
    assert first == second
    assert first[0] == first[2] != first[1]


def test_limit_counts_rows_read(tmp_path):
    p = write_lines(tmp_path / "d.jsonl", [b'{"prompt": "a"}', b"bad", b'{"prompt": "c"}'])
    out = list(iter_items(DataConfig(path=str(p), limit=2)))
    assert len(out) == 2 and isinstance(out[1], Skipped)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(
    st.one_of(
        st.binary(max_size=60).filter(lambda b: b"\n" not in b),
        st.builds(lambda s: json.dumps({"prompt": s}).encode("utf-8", "surrogatepass"), st.text(max_size=20)),
        st.sampled_from([b'{"messages": [{"role": "user", "content": "q"}]}', b"{", b"null", b'"x"',
                         b"[" * 5000, b"1" * 5000, b'{"prompt": "\\ud800"}', b"\xef\xbb\xbf{}"]),
    ),
    max_size=25,
))
def test_fuzz_every_line_yields_exactly_one_record(tmp_path, lines):
    p = tmp_path / "fuzz.jsonl"
    p.write_bytes(b"\n".join(lines) + b"\n")
    out = list(iter_items(DataConfig(path=str(p))))  # must never raise
    expected = [n for n, raw in enumerate(lines, 1) if raw.strip(b" \t\r\n") and not (
        n == 1 and raw.startswith(b"\xef\xbb\xbf") and not raw[3:].strip(b" \t\r\n"))]
    got = [r.source_line if isinstance(r, Item) else r.line for r in out]
    assert got == expected
    for r in out:
        assert isinstance(r, (Item, Skipped))
        if isinstance(r, Skipped):
            assert r.reason
