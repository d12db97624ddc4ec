"""Streaming readers for text formats: JSON Lines, JSON arrays and CSV (optionally gzip-compressed).

Each reader yields, in file order, one ``Row`` per usable record or one ``Skipped`` per record it
cannot decode (invalid UTF-8, bad JSON, not an object, wrong column count), and goes on. Memory holds
one record at a time (plus one read chunk): files of any size stream. A UTF-8 byte-order mark and
CRLF line ends are accepted everywhere. Blank lines in JSON Lines are not records and yield nothing.

These readers never normalize rows (``shapes`` does) and never raise for bad records. They raise
``ConfigError`` only when the file as a whole cannot be read (missing, not a JSON array nor JSON
Lines, a CSV without header).
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
import re
from collections.abc import Generator
from pathlib import Path
from typing import Any, BinaryIO

from harvest.dataset.jsonarray import NotAnArray, split_array
from harvest.dataset.records import Row, Skipped
from harvest.errors import ConfigError

#: A record longer than this is skipped without being held in memory.
MAX_RECORD_BYTES = 256 * 1024 * 1024

_BOM = b"\xef\xbb\xbf"
#: Lone surrogates that ``surrogateescape`` decoding puts where bytes were not UTF-8.
_UNDECODABLE = re.compile("[\udc80-\udcff]")


def open_binary(path: str | Path) -> BinaryIO:
    """Open a data file for binary reading; ``.gz`` files are decompressed on the fly."""
    path = Path(path)
    try:
        if path.suffix == ".gz":
            return gzip.open(path, "rb")  # type: ignore[return-value]
        return open(path, "rb")
    except OSError as exc:
        raise ConfigError(str(path), [(str(path), f"cannot open data file: {exc.strerror or exc}")]) from None


def parse_json_record(source: str, line: int, data: bytes | str) -> Row | Skipped:
    """Decode one JSON object (bytes are decoded as strict UTF-8). Never raises for bad data."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            return Skipped(source, line, f"not valid UTF-8 (byte {exc.start + 1} of the record)")
    else:
        text = data
        bad = _UNDECODABLE.search(text)
        if bad:
            return Skipped(source, line, f"not valid UTF-8 (character {bad.start() + 1} of the record)")
    try:
        value: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {line + exc.lineno - 1}, column {exc.colno}"
        return Skipped(source, line, f"bad JSON: {exc.msg} ({where})")
    except RecursionError:
        return Skipped(source, line, "bad JSON: nested too deeply")
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        return Skipped(source, line, f"bad JSON: {exc}")
    if not isinstance(value, dict):
        kind = "null" if value is None else type(value).__name__
        return Skipped(source, line, f"record is a JSON {kind}, expected an object")
    return Row(source, line, value)


def read_jsonl(path: str | Path, skip: int = 0) -> Generator[Row | Skipped, None, None]:
    """Yield the records of a JSON Lines file, one per non-blank line; ``line`` is the file line.

    The first ``skip`` records are passed over without being parsed (a resumed ingest).
    """
    source = str(path)
    with open_binary(path) as f:
        line = 0
        while True:
            raw = f.readline(MAX_RECORD_BYTES + 1)
            if not raw:
                return
            line += 1
            if len(raw) > MAX_RECORD_BYTES and not raw.endswith(b"\n"):
                while True:  # drain the rest of the over-long line without keeping it
                    more = f.readline(1 << 20)
                    if not more or more.endswith(b"\n"):
                        break
                if skip:
                    skip -= 1
                else:
                    yield Skipped(source, line, f"line longer than {MAX_RECORD_BYTES} bytes")
                continue
            if line == 1 and raw.startswith(_BOM):
                raw = raw[len(_BOM):]
            raw = raw.strip(b" \t\r\n")
            if raw:
                if skip:
                    skip -= 1
                else:
                    yield parse_json_record(source, line, raw)


def read_json(path: str | Path, chunk: int = 1 << 20) -> Generator[Row | Skipped, None, None]:
    """Yield the elements of a top-level JSON array, streamed; ``line`` is where each starts.

    A ``.json`` file whose first line is a complete JSON object is read as JSON Lines (a common
    misnaming). Anything else that is not an array is a ``ConfigError``.
    """
    source = str(path)
    with open_binary(path) as f:
        try:
            for piece in split_array(f, source, chunk):
                if isinstance(piece, Skipped):
                    yield piece
                else:
                    line, text = piece
                    yield parse_json_record(source, line, text)
            return
        except NotAnArray as exc:
            first = exc.first
    if first == "":
        return  # an empty file holds no records
    if first == "{" and _first_line_is_object(path):
        yield from read_jsonl(path)
        return
    problem = f"expected a JSON array or JSON Lines; the file starts with {first!r}"
    raise ConfigError(source, [(source, problem)])


def _first_line_is_object(path: str | Path) -> bool:
    with open_binary(path) as f:
        for raw in iter(lambda: f.readline(MAX_RECORD_BYTES), b""):
            raw = raw.strip(b" \t\r\n")
            if raw.startswith(_BOM):
                raw = raw[len(_BOM):].strip()
            if raw:
                return isinstance(parse_json_record("", 1, raw), Row)
    return False


def read_csv(path: str | Path, delimiter: str | None = None) -> Generator[Row | Skipped, None, None]:
    """Yield the rows of a CSV file with a header line, as column -> text mappings.

    ``line`` is the file line where the record starts (the header is line 1). A ``.tsv`` file is
    read with a tab delimiter unless one is given. Columns holding JSON text (e.g. a ``messages``
    column) are decoded later, by ``shapes``.
    """
    source = str(path)
    if delimiter is None:
        delimiter = "\t" if Path(path).name.removesuffix(".gz").endswith(".tsv") else ","
    # The csv module caps fields at 128 KiB by default (process-wide); a 1 MB prompt is legitimate.
    if csv.field_size_limit() < MAX_RECORD_BYTES:
        csv.field_size_limit(MAX_RECORD_BYTES)
    with contextlib.ExitStack() as stack:
        raw = stack.enter_context(open_binary(path))
        text = stack.enter_context(
            io.TextIOWrapper(raw, encoding="utf-8-sig", errors="surrogateescape", newline="")
        )
        reader = csv.reader(text, delimiter=delimiter)
        try:
            header = next(reader, None)
        except csv.Error as exc:
            raise ConfigError(source, [(source, f"unreadable CSV header: {exc}")]) from None
        if header is None:
            return
        if len(set(header)) != len(header) or any(_UNDECODABLE.search(h) for h in header):
            raise ConfigError(source, [(source, f"CSV header has repeated or non-UTF-8 names: {header}")])
        previous_end = reader.line_num
        while True:
            start = previous_end + 1
            try:
                record = next(reader, None)
            except csv.Error as exc:
                if reader.line_num == previous_end:  # no progress: give up on the rest of the file
                    yield Skipped(source, start, f"CSV: {exc}; the rest of the file cannot be read")
                    return
                previous_end = reader.line_num
                yield Skipped(source, start, f"CSV: {exc}")
                continue
            if record is None:
                return
            previous_end = reader.line_num
            if not record:
                continue  # blank line
            if len(record) != len(header):
                yield Skipped(source, start,
                              f"CSV row has {len(record)} fields, the header has {len(header)}")
                continue
            bad = next((name for name, v in zip(header, record) if _UNDECODABLE.search(v)), None)
            if bad is not None:
                yield Skipped(source, start, f"not valid UTF-8 (column {bad!r})")
                continue
            yield Row(source, start, dict(zip(header, record)))


__all__ = ["MAX_RECORD_BYTES", "open_binary", "parse_json_record", "read_csv", "read_json", "read_jsonl"]
