"""R4: property-based tests of every dataset reader besides JSON Lines (tests/dataset/test_jsonl.py
fuzzes that one): JSON arrays, CSV, Parquet and Hugging Face ``save_to_disk`` folders.

Two kinds of property, for each reader:
- built files: good and bad records mixed (bad JSON, wrong types, wrong field counts, bytes that are
  not UTF-8, huge fields), with a BOM and CRLF or lone-CR line ends, cut into random chunks: every
  record comes out exactly once, in order, at the line where it starts; good ones as rows, bad ones
  skipped with that line and a reason; ``iter_items`` turns each into exactly one item or skip;
- arbitrary bytes and truncated files: the reader yields rows and skips, or rejects the whole file
  with ``ConfigError``; nothing else ever escapes.
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from harvest.config import DataConfig
from harvest.dataset import Item, Row, Skipped, iter_items, read_csv, read_hf, read_json, read_parquet
from harvest.errors import ConfigError
from tests.realparts import require

require("pyarrow", "Arrow and Parquet inputs are read with pyarrow")
import pyarrow as pa  # noqa: E402
import pyarrow.ipc  # noqa: E402,F401 - pa.ipc below
import pyarrow.parquet as pq  # noqa: E402

SETTINGS = settings(max_examples=120, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
#: Tables cost more to build and write: fewer examples (700 each passed once, by hand).
TABLE_SETTINGS = settings(SETTINGS, max_examples=50)
BOM = b"\xef\xbb\xbf"

# Text that is hard on readers: quotes, brackets, separators, escapes, line ends, non-ASCII.
tricky = st.text(alphabet=st.sampled_from(list('ab ,;"\'[]{}\\\t\r\n:é漢🙂\u2028')) | st.characters(
    blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)
prompts = tricky.filter(lambda s: s.strip() != "")
HUGE = "h" * 200_000  # a huge field: beyond the csv module's default limit of 128 Ki characters


def _drain(records) -> list[Row | Skipped]:
    """Read everything; the only exception allowed out is ConfigError (the file as a whole)."""
    out = []
    for r in records:
        assert isinstance(r, (Row, Skipped)), r
        if isinstance(r, Skipped):
            assert r.line >= 1 and r.reason
        out.append(r)
    return out


def _items_match(path: Path, rows: list[Row | Skipped], **data: object) -> None:
    """iter_items gives exactly one Item or Skipped per reader record, at the same line."""
    out = list(iter_items(DataConfig(path=str(path), **data)))  # type: ignore[arg-type]
    assert [(r.source_line if isinstance(r, Item) else r.line) for r in out] == [r.line for r in rows]
    for raw, got in zip(rows, out, strict=True):
        if isinstance(raw, Skipped):
            assert isinstance(got, Skipped) and got.reason == raw.reason


# --- JSON arrays ---------------------------------------------------------------------------------

# Invalid JSON whose brackets balance, so the element can be told apart from its neighbours.
BAD_JSON = ['{"prompt": "x",, "b": 2}', '{"prompt" "x"}', '{"prompt": tru}', "{'prompt': 'x'}",
            '{"prompt": "x" "y"}', '{"prompt": 01}', '{"prompt": [1, 2,]}', '{"prompt": "x", }']
NOT_OBJECTS = ["42", '"text"', "[1, 2]", "null", "true", "-0.5e3", "[]"]


@st.composite
def json_array_files(draw):
    """(file bytes, [(start line, expected kind)]) for a JSON array of mixed elements."""
    kinds = draw(st.lists(st.sampled_from(["good", "good", "bad_json", "not_object", "bad_utf8", "huge"]),
                          max_size=12))
    newline = draw(st.sampled_from([b"\n", b"\r\n"]))
    blank = st.sampled_from([b"", b" ", b"\t", newline, newline + b"  ", b"\r"])
    out = bytearray(BOM if draw(st.booleans()) else b"")
    out += draw(blank) + b"[" + draw(blank)
    expected = []
    for i, kind in enumerate(kinds):
        if i:
            out += draw(blank) + b"," + draw(blank)
        line = out.count(b"\n") + 1
        if kind == "good":
            indent = draw(st.sampled_from([None, 1, 2]))
            obj = {"id": f"r{i}", "prompt": draw(prompts), "meta": {"n": [i, {"k": draw(tricky)}]}}
            text = json.dumps(obj, indent=indent, ensure_ascii=draw(st.booleans()))
            el = text.replace("\n", newline.decode()).encode()
        elif kind == "huge":
            el = json.dumps({"id": f"r{i}", "prompt": HUGE[:20_000]}).encode()  # many chunks long
        elif kind == "bad_json":
            el = draw(st.sampled_from(BAD_JSON)).encode()
        elif kind == "not_object":
            el = draw(st.sampled_from(NOT_OBJECTS)).encode()
        else:
            el = b'{"id": "r%d", "prompt": "caf\xe9 \xff"}' % i
        out += el
        expected.append((line, "row" if kind in ("good", "huge") else "skip"))
    out += draw(blank) + b"]" + draw(blank)
    return bytes(out), expected


@SETTINGS
@given(case=json_array_files(), chunk=st.sampled_from([3, 64, 1 << 20]))
def test_json_array_every_element_once_at_its_line(tmp_path, case, chunk):
    data, expected = case
    path = tmp_path / "d.json"
    path.write_bytes(data)
    rows = _drain(read_json(path, chunk=chunk))
    assert [(r.line, "row" if isinstance(r, Row) else "skip") for r in rows] == expected
    _items_match(path, rows)


def _key(r: Row | Skipped) -> tuple:
    if isinstance(r, Row):
        return (r.line, "row", json.dumps(r.data, sort_keys=True))
    return (r.line, "skip", r.reason)


@SETTINGS
@given(case=json_array_files(), cut=st.floats(0, 1))
def test_json_array_truncated_anywhere(tmp_path, case, cut):
    data, _ = case
    keep = data[: int(len(data) * cut)]
    whole_path, path = tmp_path / "whole.json", tmp_path / "cut.json"
    whole_path.write_bytes(data)
    path.write_bytes(keep)
    whole = [_key(r) for r in read_json(whole_path, chunk=4096)]
    starts_array = keep.lstrip(BOM).strip(b" \t\r\n").startswith(b"[")
    try:
        rows = _drain(read_json(path, chunk=4096))
    except ConfigError:
        assert not starts_array and keep.strip(b" \t\r\n") not in (b"", BOM)
        return
    if starts_array and not keep.rstrip(b" \t\r\n").endswith(b"]"):
        assert rows and isinstance(rows[-1], Skipped) and "truncated" in rows[-1].reason
    # Everything before the element cut in two and the truncation notice reads as in the whole file.
    stable = [_key(r) for r in rows[:-2]]
    assert stable == whole[: len(stable)]


@SETTINGS
@given(body=st.binary(max_size=300), prefix=st.sampled_from([b"", b"[", BOM + b"[", b"{"]))
def test_json_reader_on_arbitrary_bytes(tmp_path, body, prefix):
    path = tmp_path / "d.json"
    path.write_bytes(prefix + body)
    try:
        _drain(read_json(path, chunk=16))
    except ConfigError:
        assert prefix not in (b"[", BOM + b"[")  # an array is never rejected as a whole


# --- CSV -----------------------------------------------------------------------------------------

LINE_BREAK = re.compile(rb"\r\n|\r|\n")


@st.composite
def csv_files(draw):
    """(file bytes, [(start line, kind)]) for a CSV file with a header and mixed records."""
    eol = draw(st.sampled_from(["\r\n", "\n"]))
    out = bytearray(BOM if draw(st.booleans()) else b"")
    buf = io.StringIO()
    csv.writer(buf, lineterminator=eol).writerow(["id", "prompt", "extra"])
    out += buf.getvalue().encode()
    expected = []
    kinds = st.sampled_from(["good", "good", "fields", "bad_utf8", "blank", "huge"])
    for i, kind in enumerate(draw(st.lists(kinds, max_size=12))):
        line = len(LINE_BREAK.findall(bytes(out))) + 1
        buf = io.StringIO()
        # QUOTE_MINIMAL does not quote a lone "\r" unless the line terminator holds one.
        w = csv.writer(buf, lineterminator=eol, quoting=csv.QUOTE_MINIMAL if eol == "\r\n" else csv.QUOTE_ALL)
        if kind == "good":
            w.writerow([f"r{i}", draw(prompts), draw(tricky)])
        elif kind == "huge":
            w.writerow([f"r{i}", HUGE, ""])
        elif kind == "fields":
            w.writerow(draw(st.sampled_from([[f"r{i}", "only two"], [f"r{i}", "a", "b", "c"]])))
        elif kind == "blank":
            buf.write(eol)
        if kind == "bad_utf8":
            out += f"r{i},".encode() + b"caf\xe9 \xff" + f",x{eol}".encode()
        else:
            out += buf.getvalue().encode()
        if kind != "blank":
            expected.append((line, "row" if kind in ("good", "huge") else "skip"))
    return bytes(out), expected


@SETTINGS
@given(case=csv_files())
def test_csv_every_record_once_at_the_line_where_it_starts(tmp_path, case):
    data, expected = case
    path = tmp_path / "d.csv"
    path.write_bytes(data)
    rows = _drain(read_csv(path))
    assert [(r.line, "row" if isinstance(r, Row) else "skip") for r in rows] == expected
    for r in rows:
        if isinstance(r, Row):
            assert set(r.data) == {"id", "prompt", "extra"}
    _items_match(path, rows, id_field="id")


@SETTINGS
@given(body=st.binary(max_size=300), header=st.sampled_from([b"", b"prompt,b\n", b"\xef\xbb\xbfprompt\r\n"]))
def test_csv_reader_on_arbitrary_bytes(tmp_path, body, header):
    path = tmp_path / "d.csv"
    path.write_bytes(header + body)
    try:
        rows = _drain(read_csv(path))
    except ConfigError:
        return  # the header itself is unusable
    _items_match(path, rows)


# --- Parquet -------------------------------------------------------------------------------------


def _bad_utf8_strings(values: list[str | None], bad_at: set[int]) -> pa.Array:
    """A string array whose values at ``bad_at`` are bytes that are not UTF-8 (Arrow does not check)."""
    chunks, offsets, valid = [], [0], []
    for i, v in enumerate(values):
        raw = b"caf\xe9\xff" if i in bad_at else (v or "").encode()
        chunks.append(raw)
        offsets.append(offsets[-1] + len(raw))
        valid.append(v is not None or i in bad_at)
    mask = pa.array(valid, type=pa.bool_()).buffers()[1]
    return pa.Array.from_buffers(pa.string(), len(values), [mask, pa.py_buffer(
        pa.array(offsets, type=pa.int32()).buffers()[1]), pa.py_buffer(b"".join(chunks))])


@st.composite
def tables(draw):
    n = draw(st.integers(0, 40))
    prompts_ = [draw(st.one_of(st.none(), st.just(""), prompts, st.just(HUGE) if i == 3 else prompts))
                for i in range(n)]
    bad = {i for i in range(n) if draw(st.integers(0, 9)) == 0}
    numbers = [draw(st.one_of(st.none(), st.integers(-2**63, 2**63 - 1))) for _ in range(n)]
    nested = [draw(st.lists(st.fixed_dictionaries({"a": tricky}), max_size=3)) for _ in range(n)]
    table = pa.table({"id": [f"r{i}" for i in range(n)], "prompt": _bad_utf8_strings(prompts_, bad),
                      "n": pa.array(numbers, type=pa.int64()), "nested": nested})
    return table, bad


@TABLE_SETTINGS
@given(case=tables(), row_group=st.integers(1, 17), batch=st.integers(1, 9))
def test_parquet_every_row_once_in_order(tmp_path, case, row_group, batch):
    table, bad = case
    path = tmp_path / "d.parquet"
    pq.write_table(table, path, row_group_size=row_group)
    rows = _drain(read_parquet(path, batch_rows=batch))
    assert [r.line for r in rows] == list(range(1, table.num_rows + 1))
    assert {r.line - 1 for r in rows if isinstance(r, Skipped)} == bad
    for r in rows:
        if isinstance(r, Row):
            assert r.data["id"] == f"r{r.line - 1}"
    _items_match(path, rows, id_field="id")


@TABLE_SETTINGS
@given(case=tables(), cut=st.floats(0, 0.999), junk=st.binary(max_size=64))
def test_parquet_truncated_or_garbage_is_a_config_error_at_worst(tmp_path, case, cut, junk):
    table, _ = case
    path = tmp_path / "d.parquet"
    pq.write_table(table, path)
    data = path.read_bytes()
    for broken in (data[: int(len(data) * cut)], junk, data[:8] + junk + data[8 + len(junk):]):
        path.write_bytes(broken)
        try:
            rows = _drain(read_parquet(path))  # any exception but ConfigError fails the test
        except ConfigError as exc:
            # a configuration error that names the file and says what is wrong with it
            assert str(path) in str(exc) and exc.problems and all(msg for _, msg in exc.problems), exc
        else:
            # what could be read: one record per line from 1 on, each a row or a skip with its reason
            assert [r.line for r in rows] == list(range(1, len(rows) + 1)), [r.line for r in rows]


# --- Hugging Face save_to_disk folders -----------------------------------------------------------


def _save_to_disk(folder: Path, shards: list[pa.Table], state: object | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"data-{i:05d}-of-{len(shards):05d}.arrow" for i in range(len(shards))]
    for name, table in zip(names, shards, strict=True):
        with pa.OSFile(str(folder / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
    state = {"_data_files": [{"filename": n} for n in names]} if state is None else state
    (folder / "state.json").write_text(json.dumps(state))


@TABLE_SETTINGS
@given(case=tables(), cuts=st.lists(st.integers(0, 40), max_size=3))
def test_hf_folder_every_row_once_shard_by_shard(tmp_path, case, cuts):
    table, bad = case
    bounds = sorted({0, table.num_rows, *(c for c in cuts if c <= table.num_rows)})
    shards = [table.slice(a, b - a) for a, b in zip(bounds, bounds[1:], strict=False)] or [table]
    folder = tmp_path / "ds"
    for f in folder.glob("*") if folder.exists() else ():
        f.unlink()
    _save_to_disk(folder, shards)
    rows = _drain(read_hf(folder))
    assert len(rows) == table.num_rows
    expected_lines = [line for s in shards for line in range(1, s.num_rows + 1)]
    assert [r.line for r in rows] == expected_lines
    assert sum(isinstance(r, Skipped) for r in rows) == len(bad)


STATE_JSON = st.one_of(
    st.binary(max_size=80),
    st.builds(lambda v: json.dumps(v).encode(), st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8)),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
            st.sampled_from(["_data_files", "filename", "splits", "x"]), inner, max_size=3),
        max_leaves=8)),
    st.sampled_from([b'{"_data_files": [{"filename": 5}]}', b'{"_data_files": [{"filename": "../x"}]}',
                     b'{"_data_files": [{"filename": null}]}', b"[]", b'"state"',
                     b'{"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}']),
)


@SETTINGS
@given(state=STATE_JSON, dataset_dict=st.one_of(st.none(), STATE_JSON),
       arrow=st.one_of(st.none(), st.binary(max_size=64)))
def test_hf_folder_with_broken_metadata_or_shards_is_a_config_error_at_worst(tmp_path, state, dataset_dict,
                                                                            arrow):
    root = tmp_path / "hf"
    split = root / "train"
    for p in sorted(root.rglob("*"), reverse=True) if root.exists() else ():
        p.unlink() if p.is_file() else p.rmdir()
    _save_to_disk(split, [pa.table({"prompt": ["a", "b"]})])
    (split / "state.json").write_bytes(state)
    if arrow is not None:
        (split / "data-00000-of-00001.arrow").write_bytes(arrow)
    target = split
    if dataset_dict is not None:
        (root / "dataset_dict.json").write_bytes(dataset_dict)
        target = root
    try:
        rows = _drain(read_hf(target))
    except ConfigError:
        return
    assume(rows)
    _items_match(target, rows)
