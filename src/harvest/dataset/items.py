"""The dataset layer's entry point: ``[data]`` config in, a stream of ``Item | Skipped`` out.

``iter_items`` picks the reader from the format (or from the extension / folder when ``format =
"auto"``), normalizes each row and stops after ``limit`` rows (items and skipped rows both count).
Duplicated ids are *not* removed here: the stream stays memory-flat, and the ledger dedupes through
its primary key and counts the duplicates.

Nothing here holds more than one row, and nothing raises for a bad row; ``ConfigError`` means the
dataset as a whole cannot be read (missing path, unknown extension, pyarrow missing).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Collection, Generator, Iterator
from pathlib import Path

from harvest.config import DataConfig
from harvest.dataset.arrow import read_hf, read_parquet
from harvest.dataset.readers import read_csv, read_json, read_jsonl
from harvest.dataset.records import Item, Row, Skipped
from harvest.dataset.batch import MARKERS, CustomIds, batch_item, is_batch_record
from harvest.dataset.shapes import normalize
from harvest.errors import ConfigError

#: File extensions recognized by ``format = "auto"`` (a trailing ``.gz`` is allowed on text formats).
EXTENSIONS: dict[str, str] = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".jsonlines": "jsonl",
    ".json": "json",
    ".csv": "csv",
    ".tsv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".arrow": "hf",
}


def detect_format(path: str | Path, declared: str = "auto") -> str:
    """The reader to use for ``path``: ``declared`` unless it is ``auto``, else by folder/extension."""
    p = Path(path)
    source = str(p)
    if not p.exists():
        raise ConfigError(source, [(f"{source}", "dataset path does not exist")])
    if declared != "auto":
        return declared
    if p.is_dir():
        return "hf"
    name = p.name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    suffix = Path(name).suffix
    fmt = EXTENSIONS.get(suffix)
    if fmt is None or (fmt in ("parquet", "hf") and p.name.lower().endswith(".gz")):
        known = ", ".join(sorted(EXTENSIONS))
        raise ConfigError(
            source, [(source, f"cannot tell the format from the name (known: {known}); set [data] format")]
        )
    return fmt


def read_rows(
    path: str | Path, fmt: str = "auto", columns: Collection[str] | None = None, skip: int = 0
) -> Generator[Row | Skipped, None, None]:
    """Raw rows of the dataset at ``path`` in file order. ``columns`` limits columnar reads.

    ``skip`` rows are passed over first: JSON Lines without parsing them, other formats without
    anything beyond their reader's own decoding.
    """
    fmt = detect_format(path, fmt)
    if fmt == "jsonl":
        return read_jsonl(path, skip)
    if skip:
        return _skipping(read_rows(path, fmt, columns), skip)
    if fmt == "json":
        return read_json(path)
    if fmt == "csv":
        return read_csv(path)
    if fmt == "parquet":
        return read_parquet(path, columns)
    if fmt == "hf":
        return read_hf(path, columns)
    raise ConfigError(str(path), [(str(path), f"unknown data format {fmt!r}")])


def _skipping(rows: Generator[Row | Skipped, None, None], n: int) -> Generator[Row | Skipped, None, None]:
    with contextlib.closing(rows):
        for _ in itertools.islice(rows, n):
            pass
        yield from rows


def used_columns(config: DataConfig) -> set[str]:
    """The columns a row can be read from under ``config`` (columnar readers load only these)."""
    names = {config.prompt_field, config.messages_field, config.conversations_field, "id",
             *MARKERS, "method", "url"}
    if config.id_field:
        names.add(config.id_field)
    return names


def is_batch_file(config: DataConfig) -> bool:
    """Whether the dataset is read as an OpenAI batch file: ``shape = "openai-batch"``, or ``auto``
    and its first record is a batch line (``custom_id`` and ``body``)."""
    if config.shape != "auto":
        return config.shape == "openai-batch"
    rows = read_rows(config.path, config.format, used_columns(config))
    with contextlib.closing(rows):
        first = next((r for r in rows if isinstance(r, Row)), None)
    return first is not None and is_batch_record(first.data)


def iter_items(config: DataConfig, skip: int = 0, *, models: Collection[str] | None = None) -> Iterator[Item | Skipped]:
    """Stream the dataset of ``config`` as normalized items and skipped rows, in file order.

    The same file and config give the same sequence (ids, lines, order) every time, which is what
    lets the ledger resume an interrupted ingest by position. ``skip`` records are passed over
    first, cheaply (never normalized): ``iter_items(c, skip=n)`` yields what ``iter_items(c)``
    yields after its first ``n``. A batch file (:func:`is_batch_file`) is read from its start
    whatever ``skip`` (a repeated custom_id is known by the lines before it); ``models`` are the
    names a batch line's ``body.model`` may hold (None: any).
    """
    if config.limit is not None and skip >= config.limit:
        return
    if is_batch_file(config):
        yield from itertools.islice(_batch_items(config, models), skip, config.limit)
        return
    rows = read_rows(config.path, config.format, used_columns(config), skip)
    with contextlib.closing(rows):
        count = skip
        for row in rows:
            yield row if isinstance(row, Skipped) else normalize(row, config)
            count += 1
            if config.limit is not None and count >= config.limit:
                return


def _batch_items(config: DataConfig, models: Collection[str] | None) -> Iterator[Item | Skipped]:
    rows = read_rows(config.path, config.format, used_columns(config))
    ids = CustomIds()
    with contextlib.closing(rows):
        for row in rows:
            if isinstance(row, Skipped):
                yield row
            else:
                yield ids.check(batch_item(row, models=models, system_prompt=config.system_prompt))


__all__ = ["EXTENSIONS", "detect_format", "is_batch_file", "iter_items", "read_rows", "used_columns"]
