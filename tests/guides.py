"""The README and the guides its table links: where the tests that run a document's examples find
them. The README stays short (a title, the two set-up commands, install, a first job, the table);
everything else lives in a guide, and the tests read each example where it is written."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: The heading of the README's table of guides.
GUIDES_HEADING = "## Guides\n"


def guide_links() -> list[str]:
    """The targets of the links in the README's table of guides, as written (relative to the root)."""
    text = README.read_text(encoding="utf-8")
    body = text[text.index(GUIDES_HEADING):]
    body = body[:body.find("\n## ", 1)] if "\n## " in body[1:] else body
    return [m.group(1) for line in body.splitlines() if line.startswith("| [")
            for m in [re.match(r"^\| \[[^\]]+\]\(([^)#\s]+)\)", line)] if m]


def guides() -> list[Path]:
    """The README's guides, each as a path."""
    return [ROOT / link for link in guide_links()]


def documents() -> list[Path]:
    """The README, then every guide it links."""
    return [README, *guides()]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: lower case, punctuation but `-` and `_` dropped,
    spaces as `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings (outside code blocks)."""
    found, fenced = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"^#{1,6} ", line):
            found.add(slug(line.lstrip("#")))
    return found
