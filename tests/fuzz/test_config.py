"""R4: property-based tests of the config loader (``load_config``).

- Arbitrary bytes, and TOML-ish text assembled from real table and field names with random values:
  either a configuration comes back or ``ConfigError`` does; nothing else escapes.
- A value of the wrong type (or out of range, infinite, NaN, huge) in any field of any table: the
  error names the file, the table and that field, and only it.
- A byte-order mark and CRLF line ends change nothing; text in another encoding (UTF-16, Latin-1)
  is rejected naming the file; nesting deep enough to exhaust a recursive parser is rejected too.
"""

from __future__ import annotations

import json
import math
import typing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from harvest.config import (
    ClientConfig,
    DataConfig,
    HarvestConfig,
    OutputConfig,
    PreflightConfig,
    RunConfig,
    SamplingConfig,
    ServerConfig,
    load_config,
)
from harvest.errors import ConfigError

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
TABLES: dict[str, type[BaseModel]] = {
    "server": ServerConfig, "preflight": PreflightConfig, "data": DataConfig, "sampling": SamplingConfig,
    "client": ClientConfig, "output": OutputConfig, "run": RunConfig}
BASE = {"server": {"engine": "vllm", "model": "m"}, "data": {"path": "in.jsonl"}}


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def toml_text(doc: dict[str, dict[str, Any]], newline: str = "\n") -> str:
    lines = []
    for table, fields in doc.items():
        lines.append(f"[{table}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in fields.items()]
    return newline.join(lines) + newline


def load(tmp_path: Path, data: bytes) -> HarvestConfig:
    path = tmp_path / "job.toml"
    path.write_bytes(data)
    return load_config(path)


def load_or_config_error(tmp_path: Path, data: bytes) -> HarvestConfig | ConfigError:
    try:
        return load(tmp_path, data)
    except ConfigError as exc:
        source = str(tmp_path / "job.toml")
        assert exc.problems and all(loc.startswith(source) and msg for loc, msg in exc.problems)
        return exc


# --- anything at all -------------------------------------------------------------------------------

FIELDS = [(t, f) for t, model in TABLES.items() for f in model.model_fields]
scalars = st.one_of(st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=20))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)


@st.composite
def tomlish(draw) -> bytes:
    """Text built from the real tables and fields, random values, and some junk in between."""
    doc: dict[str, dict[str, Any]] = {}
    for table, field in draw(st.lists(st.sampled_from(FIELDS), max_size=8)):
        doc.setdefault(table, {})[field] = draw(values)
    text = toml_text(doc, draw(st.sampled_from(["\n", "\r\n"])))
    if draw(st.booleans()):
        cut = draw(st.integers(0, len(text)))
        junk = ["", "[", "]]", "=", '"', "\x00", "é", "[[server]]\n", "\n[x.y]\n", "a.b.c = 1\n", "'''"]
        text = text[:cut] + draw(st.sampled_from(junk)) + text[cut:]
    data = text.encode("utf-8", "surrogatepass")
    return (b"\xef\xbb\xbf" + data) if draw(st.booleans()) else data


@SETTINGS
@given(data=st.one_of(st.binary(max_size=200), tomlish()))
def test_anything_loads_or_is_a_config_error(tmp_path, data):
    load_or_config_error(tmp_path, data)


# --- one wrong field names itself ----------------------------------------------------------------

def wrong_values(model: type[BaseModel], field: str) -> list[Any]:
    """Values of the wrong type (or out of range) for ``field``."""
    ann = model.model_fields[field].annotation
    args = typing.get_args(ann)
    origin = typing.get_origin(ann)
    kinds = set(args) | {ann}
    out: list[Any] = []
    if dict in kinds or origin is dict:
        return ["not a table", 3, [1], {"K": "nul \x00 inside"}]  # a NUL cannot reach argv or env
    out.append({"nested": {"deep": [1, 2]}})  # a table where no table belongs
    if origin is list:
        inner = args[0]
        return out + ["not a list", [{"x": 1}]] + ([["a"], [True], [1.5]] if inner is int else
                                                    [[5], [True], ["ok", "a\x00b"]])
    if origin is typing.Literal:
        return out + ["no-such-choice", 1]
    if str in kinds:
        out += [5, 1.5, True, ["text"], "path\x00with a NUL"]
    if int in kinds and bool not in kinds:
        out += ["12", 1.5, True, 10**40]
    if float in kinds:
        out += ["0.5", True, math.inf, math.nan, -math.inf]
    if bool in kinds:
        out += ["yes", 1, 0.0]
    return out


def bounded_above(model: type[BaseModel], field: str) -> bool:
    return any(hasattr(m, "le") or hasattr(m, "lt") for m in model.model_fields[field].metadata)


def cases() -> list[tuple[str, str, Any]]:
    out = []
    for table, model in TABLES.items():
        for field in model.model_fields:
            for value in wrong_values(model, field):
                if value == 10**40 and not bounded_above(model, field):
                    continue  # a huge count without an upper bound (tp, seed) is the engine's to judge
                out.append((table, field, value))
    return out


@pytest.mark.parametrize("n, case", list(enumerate(cases())), ids=lambda v: "" if isinstance(v, int) else
                         f"{v[0]}.{v[1]}={v[2]!r}"[:60])
def test_a_wrong_value_is_rejected_naming_its_table_and_field(tmp_path, n, case):
    """Every field of every table, each with every kind of wrong value (exhaustive, not sampled)."""
    table, field, value = case
    crlf = n % 2 == 1
    doc = {t: dict(f) for t, f in BASE.items()}
    doc.setdefault(table, {})[field] = value
    result = load_or_config_error(tmp_path, toml_text(doc, "\r\n" if crlf else "\n").encode())
    assert isinstance(result, ConfigError), f"[{table}] {field} = {value!r} was accepted"
    where = "[server.env]" if (table, field) == ("server", "env") else f"[{table}] {field}"
    want = f"{tmp_path / 'job.toml'} {where}"
    assert all(loc == want or loc.startswith(want + ".") for loc, _ in result.problems), \
        (want, result.problems)


def test_every_field_of_every_table_is_covered():
    covered = {(t, f) for t, f, _ in cases()}
    assert covered == set(FIELDS)


# --- encodings, BOM, CRLF, huge and deep ------------------------------------------------------------

VALID = {"server": {"engine": "llamacpp", "model": "m.gguf", "port": 8123, "extra_args": ["-c", "4096"],
                    "env": {"X": "é"}},
         "data": {"path": "in.jsonl", "system_prompt": "Réponds brièvement. 漢字 🙂"},
         "sampling": {"temperature": 0.7, "stop": ["\n\n"]}, "run": {"history": "original"}}


@SETTINGS
@given(bom=st.booleans(), newline=st.sampled_from(["\n", "\r\n"]))
def test_bom_and_crlf_change_nothing(tmp_path, bom, newline):
    plain = load(tmp_path, toml_text(VALID).encode())
    data = toml_text(VALID, newline).encode()
    other = load(tmp_path, (b"\xef\xbb\xbf" + data) if bom else data)
    assert other.model_dump() == plain.model_dump()
    assert other.data.system_prompt == "Réponds brièvement. 漢字 🙂"


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "latin-1", "cp1252", "utf-32"])
def test_text_in_another_encoding_is_rejected_naming_the_file(tmp_path, encoding):
    result = load_or_config_error(tmp_path, toml_text(VALID).encode(encoding, "replace"))
    assert isinstance(result, ConfigError)
    ((loc, msg),) = result.problems
    assert loc == str(tmp_path / "job.toml") and ("not UTF-8" in msg or "TOML syntax" in msg), msg


def test_huge_strings_load_and_huge_numbers_name_their_field(tmp_path):
    prompt = "p" * 5_000_000
    cfg = load(tmp_path, toml_text({**VALID, "data": {"path": "in.jsonl", "system_prompt": prompt}}).encode())
    assert cfg.data.system_prompt == prompt
    for table, field in [("server", "port"), ("client", "concurrency"), ("sampling", "max_tokens")]:
        doc = {t: dict(f) for t, f in BASE.items()}
        doc.setdefault(table, {})[field] = 10**400 if field == "port" else -(10**30)
        result = load_or_config_error(tmp_path, toml_text(doc).encode())
        assert isinstance(result, ConfigError)
        assert [loc.split(" ", 1)[1] for loc, _ in result.problems] == [f"[{table}] {field}"]


@pytest.mark.parametrize("text", ["a = " + "[" * 100_000, "a = " + "{b = " * 20_000,
                                  "[server]\nextra_args = " + "[" * 3000 + "]" * 3000])
def test_nesting_that_exhausts_the_parser_is_a_config_error(tmp_path, text):
    assert isinstance(load_or_config_error(tmp_path, text.encode()), ConfigError)
