"""Streaming readers for columnar data: Parquet files and Hugging Face ``save_to_disk`` folders.

Parquet is read one record batch at a time through pyarrow. A ``save_to_disk`` folder holds
``state.json`` (which names the data files in order), ``dataset_info.json`` and one or more Arrow
IPC *stream* files (``data-00000-of-00001.arrow``); they are read batch by batch with
``pyarrow.ipc`` — the ``datasets`` library is not needed. A ``DatasetDict`` folder
(``dataset_dict.json`` plus one folder per split) is accepted when it has a single split; with
several, the path must name the split folder.

pyarrow is the optional ``parquet`` extra and is imported only when one of these readers runs. The
readers yield ``Row`` records (line = 1-based row number within the file) or ``Skipped`` for a row
whose values cannot be converted (e.g. a string column holding bytes that are not UTF-8). They never
load a whole table, and raise ``ConfigError`` only for a file or folder that cannot be read at all.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Generator, Iterator
from pathlib import Path
from typing import Any

from harvest.dataset.records import Row, Skipped
from harvest.errors import ConfigError

BATCH_ROWS = 1024


def _pyarrow(source: str) -> Any:
    try:
        import pyarrow
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise ConfigError(
            source,
            [(source, "reading Parquet or Hugging Face datasets needs pyarrow:"
                      " install the parquet extra into harvest's environment (pip install -e '.[parquet]'"
                      " in the clone)")],
        ) from None
    return pyarrow


def _select(batch: Any, columns: Collection[str] | None) -> Any:
    if columns is None:
        return batch
    keep = [name for name in batch.schema.names if name in columns]
    return batch.select(keep)


def _batch_rows(source: str, batch: Any, first_line: int) -> Generator[Row | Skipped, None, None]:
    pa = _pyarrow(source)
    try:
        rows = batch.to_pylist()
    except (pa.ArrowException, UnicodeDecodeError, ValueError):
        # One bad value spoils the whole batch conversion: convert row by row to isolate it.
        for i in range(batch.num_rows):
            try:
                (row,) = batch.slice(i, 1).to_pylist()
            except (pa.ArrowException, UnicodeDecodeError, ValueError) as exc:
                yield Skipped(source, first_line + i, f"row cannot be converted: {exc}")
            else:
                yield Row(source, first_line + i, row)
        return
    for i, row in enumerate(rows):
        yield Row(source, first_line + i, row)


def read_parquet(
    path: str | Path, columns: Collection[str] | None = None, batch_rows: int = BATCH_ROWS
) -> Generator[Row | Skipped, None, None]:
    """Yield the rows of a Parquet file, batch by batch. Only ``columns`` are read when given."""
    source = str(path)
    pa = _pyarrow(source)
    try:
        pf = pa.parquet.ParquetFile(source)
        names = pf.schema_arrow.names
        wanted = None if columns is None else [n for n in names if n in columns]
        batches = pf.iter_batches(batch_size=batch_rows, columns=wanted)
        line = 1
        for batch in batches:
            yield from _batch_rows(source, batch, line)
            line += batch.num_rows
    except (OSError, pa.ArrowException) as exc:
        raise ConfigError(source, [(source, f"cannot read Parquet file: {exc}")]) from None


def read_arrow_file(
    path: str | Path, columns: Collection[str] | None = None
) -> Generator[Row | Skipped, None, None]:
    """Yield the rows of one Arrow IPC file, stream format (what ``datasets`` writes) or file format."""
    source = str(path)
    pa = _pyarrow(source)
    try:
        with pa.memory_map(source, "r") as mm:
            try:
                reader = pa.ipc.open_stream(mm)
                batches: Iterator[Any] = iter(reader)
            except pa.ArrowInvalid:
                mm.seek(0)
                file_reader = pa.ipc.open_file(mm)
                batches = (file_reader.get_batch(i) for i in range(file_reader.num_record_batches))
            line = 1
            for batch in batches:
                batch = _select(batch, columns)
                # Memory-mapped batches are zero-copy; convert in slices to keep Python objects few.
                for off in range(0, batch.num_rows, BATCH_ROWS):
                    part = batch.slice(off, BATCH_ROWS)
                    yield from _batch_rows(source, part, line)
                    line += part.num_rows
    except (OSError, pa.ArrowException) as exc:
        raise ConfigError(source, [(source, f"cannot read Arrow file: {exc}")]) from None


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(str(path), [(str(path), f"unreadable dataset metadata: {exc}")]) from None


def hf_data_files(where: str | Path) -> list[Path]:
    """The Arrow files of a ``save_to_disk`` folder, in dataset order."""
    folder = Path(where)
    source = str(folder)
    if (folder / "dataset_dict.json").is_file():
        meta = _load_json(folder / "dataset_dict.json")
        splits = meta.get("splits") if isinstance(meta, dict) else None
        if not isinstance(splits, list) or not all(isinstance(name, str) for name in splits):
            where = str(folder / "dataset_dict.json")
            raise ConfigError(where, [(where, "'splits' is not a list of split names")])
        if len(splits) != 1:
            raise ConfigError(
                source,
                [(source, f"this dataset has splits {splits}; set [data] path to one split's folder")],
            )
        folder = folder / splits[0]
    state_path = folder / "state.json"
    if state_path.is_file():
        state = _load_json(state_path)
        entries = state.get("_data_files") if isinstance(state, dict) else None
        if not isinstance(entries, list) or not all(isinstance(e, dict) and isinstance(e.get("filename"), str)
                                                    for e in entries):
            where = str(state_path)
            raise ConfigError(where, [(where, "'_data_files' is not a list of {filename}")])
        files = [folder / e["filename"] for e in entries]
    else:
        files = sorted(folder.glob("*.arrow"))
    if not files:
        raise ConfigError(source, [(source, "no Arrow data files (expected a datasets save_to_disk folder)")])
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ConfigError(source, [(source, f"data files named in state.json are missing: {missing}")])
    return files


def read_hf(path: str | Path, columns: Collection[str] | None = None) -> Generator[Row | Skipped, None, None]:
    """Yield the rows of a Hugging Face ``save_to_disk`` folder (or of a single ``.arrow`` file)."""
    path = Path(path)
    files = [path] if path.is_file() else hf_data_files(path)
    for f in files:
        yield from read_arrow_file(f, columns)


__all__ = ["BATCH_ROWS", "hf_data_files", "read_arrow_file", "read_hf", "read_parquet"]
