"""docs/config.md is what the config models say: every setting described, the page up to date."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel

from harvest import config as cfg
from harvest.configdoc import TABLES, render, undocumented

ROOT = Path(__file__).resolve().parents[1]


def test_every_setting_has_a_description():
    assert undocumented() == []


def test_the_page_is_what_the_models_say():
    page = (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
    assert page == render(), "docs/config.md drifted from src/harvest/config/: run scripts/config-docs"


def test_every_table_of_a_job_file_is_on_the_page():
    documented = {model for _, model in TABLES}
    for name, field in cfg.HarvestConfig.model_fields.items():
        if field.exclude:
            continue
        models = [a for a in (field.annotation, *getattr(field.annotation, "__args__", ()))
                  if isinstance(a, type) and issubclass(a, BaseModel)]
        assert models and set(models) <= documented, f"[{name}] is not on docs/config.md"
    page = render()
    for header, model in TABLES:
        for name in model.model_fields:
            assert f"| `{name}` |" in page, f"{header} {name}"


def test_the_check_fails_on_a_stale_page(tmp_path):
    # The script's --check is what a developer runs; a copy of the tree with one description
    # changed must fail it, naming the page.
    copy = tmp_path / "tree"
    (copy / "scripts").mkdir(parents=True)
    (copy / "docs").mkdir()
    (copy / "scripts" / "config-docs").write_text((ROOT / "scripts" / "config-docs").read_text())
    src = copy / "src" / "harvest"
    src.mkdir(parents=True)
    (src / "config").mkdir()
    here = ROOT / "src" / "harvest"
    for f in [*here.glob("*.py"), *(here / "config").glob("*.py")]:  # the models and what they import
        (src / f.relative_to(here)).write_text(f.read_text())
    (copy / "docs" / "config.md").write_text((ROOT / "docs" / "config.md").read_text())
    ok = subprocess.run([sys.executable, str(copy / "scripts" / "config-docs"), "--check"],
                        capture_output=True, text=True, timeout=60, cwd=copy)
    assert ok.returncode == 0, ok.stderr
    text = (src / "config" / "server.py").read_text()
    (src / "config" / "server.py").write_text(text.replace("seconds between SIGTERM and SIGKILL",
                                                          "seconds between SIGTERM and SIGKILL, changed"))
    stale = subprocess.run([sys.executable, str(copy / "scripts" / "config-docs"), "--check"],
                           capture_output=True, text=True, timeout=60, cwd=copy)
    assert stale.returncode == 1 and "docs/config.md is out of date" in stale.stderr
