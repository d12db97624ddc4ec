"""Format detection and the iter_items entry point."""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
import pytest

from harvest.config import DataConfig
from harvest.dataset import Item, detect_format, iter_items
from harvest.errors import ConfigError


@pytest.mark.parametrize(
    ("name", "fmt"),
    [("a.jsonl", "jsonl"), ("a.ndjson", "jsonl"), ("a.JSONL.gz", "jsonl"), ("a.json", "json"),
     ("a.csv", "csv"), ("a.tsv.gz", "csv"), ("a.parquet", "parquet"), ("a.arrow", "hf")],
)
def test_format_from_extension(tmp_path, name, fmt):
    p = tmp_path / name
    p.write_bytes(b"")
    assert detect_format(p) == fmt


def test_folder_is_a_hf_dataset_and_declared_format_wins(tmp_path):
    assert detect_format(tmp_path) == "hf"
    p = tmp_path / "prompts.txt"
    p.write_text('{"prompt": "declared"}\n')
    assert detect_format(p, "jsonl") == "jsonl"
    (item,) = list(iter_items(DataConfig(path=str(p), format="jsonl")))
    assert isinstance(item, Item) and item.user_turns() == ("declared",)


def test_unknown_extension_and_missing_path_are_config_errors(tmp_path):
    p = tmp_path / "prompts.txt"
    p.write_text("")
    with pytest.raises(ConfigError, match="set \\[data\\] format"):
        detect_format(p)
    with pytest.raises(ConfigError, match="does not exist"):
        list(iter_items(DataConfig(path=str(tmp_path / "nope.jsonl"))))


def test_missing_pyarrow_is_a_clear_config_error(tmp_path, monkeypatch):
    p = tmp_path / "d.parquet"
    p.write_bytes(b"PAR1")
    for name in [m for m in sys.modules if m == "pyarrow" or m.startswith("pyarrow.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # makes `import pyarrow` raise ImportError
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[parquet\]' in the clone"):
        list(iter_items(DataConfig(path=str(p))))


def test_closing_the_stream_early_closes_the_file(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text("".join(f'{{"prompt": "{i}"}}\n' for i in range(100)))

    def open_here() -> bool:
        return any(Path(f.path) == p for f in psutil.Process().open_files())

    stream = iter_items(DataConfig(path=str(p), limit=50))
    assert isinstance(next(stream), Item)
    assert open_here()
    stream.close()
    assert not open_here()
    assert len(list(iter_items(DataConfig(path=str(p), limit=50)))) == 50
    assert not open_here()  # reaching the limit closes the file too
