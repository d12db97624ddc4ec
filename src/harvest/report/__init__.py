"""report: a run, tune or compare folder rendered as one self-contained HTML page.

    path = write_report("run/")                 # run/report.html; kind found from the folder
    html_text, kind = render_report("run/tune")

The page reads the records the other commands already write and read (``run_status`` /
timeline.json for a run, tune.json for a sweep, compare.json for a comparison) and computes
nothing of its own. It never writes anywhere but the output file, and never changes the folder's
records. Module map: :mod:`.html` (page, tables), :mod:`.charts` (figures, drawn by :mod:`.plot`),
:mod:`.run`, :mod:`.tune`, :mod:`.compare` (one page each).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from harvest import safefiles
from harvest.version import __version__
from harvest.errors import ConfigError
from harvest.ledger import LEDGER_FILE

REPORT_FILE = "report.html"
KINDS = ("run", "tune", "compare")


def folder_kind(folder: str | Path) -> str:
    """``run``, ``tune`` or ``compare``; ConfigError naming the folder when it is none of them."""
    folder = Path(folder)
    if (folder / "tune.json").is_file():
        return "tune"
    if (folder / "compare.json").is_file():
        return "compare"
    if (folder / LEDGER_FILE).is_file():
        return "run"
    raise ConfigError(str(folder), [(str(folder), f"not a run folder ({LEDGER_FILE}), a tune folder (tune.json) "
                                                  "or a compare folder (compare.json)")])


def render_report(folder: str | Path, *, shown_as: Path | None = None, link_base: str = "") -> tuple[str, str]:
    """(HTML text, kind) of the report of ``folder``; ``shown_as``: the run folder's name on the page
    when ``folder`` is a path through its held descriptor; ``link_base``: the folder as seen from
    the page's (its links to files of the folder, the launches' logs)."""
    from harvest.report.html import page

    kind = folder_kind(folder)
    make: Callable[[str | Path], tuple[str, str, list[str]]]
    if kind == "run":
        from harvest.report.run import run_page

        def make(where: str | Path) -> tuple[str, str, list[str]]:
            return run_page(where, shown_as=shown_as, link_base=link_base)
    elif kind == "tune":
        from harvest.report.tune import tune_page as make
    else:
        from harvest.report.compare import compare_page as make
    title, subtitle, sections = make(folder)
    return page(title, subtitle, sections, kind=kind, version=__version__), kind


def write_report(folder: str | Path, output: str | Path | None = None, *,
                 held: safefiles.Folder | None = None) -> Path:
    """Render the report of ``folder`` and write it (atomically, mode 0600) to ``output`` (default
    ``folder/report.html``); returns the path written. ``held``: the run folder as the command that
    ran it still holds it; the report is then read and written through that descriptor only (a
    folder swapped in for the name since is neither read nor written), and the path returned is
    where the held folder is now."""
    if held is not None and output is None:
        text, _ = render_report(held.via(), shown_as=Path(folder))
        held.write_atomic(REPORT_FILE, text)
        return held.where_now() / REPORT_FILE
    out = Path(output) if output is not None else Path(folder) / REPORT_FILE
    base = "" if output is None else os.path.relpath(os.path.abspath(folder), os.path.abspath(out.parent))
    text, _ = render_report(folder, link_base="" if base == "." else base)
    # The run folder: this user's own. An --output folder: missing ones made 0700 (whatever the
    # umask), an existing one no other user can rename things in; the file is written in it, held.
    with safefiles.Folder.hold(out.parent, create=output is not None, strict=output is None) as held:
        # private like every file harvest writes in a run folder (it shows the job's settings)
        held.write_atomic(out.name, text)
    return out


__all__ = ["KINDS", "REPORT_FILE", "folder_kind", "render_report", "write_report"]
