"""The README is for users and stays short: at most 300 lines, its table of guides links the guides
a user looks for (endpoints, engines, remote hosts, Ray, tune and compare, distillation outputs,
reliability, security, the Python API, configuration) and each exists, and every relative link of
the README and of those guides points at a file that exists (and a heading there, when it names
one)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tests.guides import README, ROOT, anchors, documents, guide_links, slug

MAX_LINES = 300
#: The guides the README's table must link, one per topic a user looks for.
REQUIRED = {"docs/endpoints.md", "docs/engines.md", "docs/remote.md", "docs/ray.md", "docs/tune.md",
            "docs/distillation.md", "RELIABILITY.md", "SECURITY.md", "docs/python-api.md", "docs/config.md"}
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_readme_has_at_most_300_lines():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; move a section to a guide in docs/"


def test_every_guide_the_readme_links_exists():
    links = guide_links()
    assert REQUIRED <= set(links), f"the README's table of guides lacks {sorted(REQUIRED - set(links))}"
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert not missing, f"the README's table links guides that do not exist: {missing}"


def relative_links(path: Path) -> list[tuple[Path, str]]:
    """(target file, anchor or "") of each relative link of a Markdown file, outside code blocks."""
    found, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target):
                continue  # http:, https:, mailto:
            file, _, anchor = target.partition("#")
            found.append(((path.parent / file).resolve() if file else path, anchor))
    return found


def test_every_relative_link_of_the_readme_and_its_guides_resolves():
    broken = []
    for doc in documents():
        for target, anchor in relative_links(doc):
            if not target.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target} does not exist")
            elif anchor and target.suffix == ".md" and anchor not in anchors(target):
                broken.append(f"{doc.relative_to(ROOT)}: {target.relative_to(ROOT)} has no heading #{anchor}")
    assert not broken, "\n".join(broken)


def test_the_slug_is_githubs():
    assert slug(" Where `scripts/install-engines llamacpp` puts llama-server") == \
        "where-scriptsinstall-engines-llamacpp-puts-llama-server"
    assert slug(" `[cluster]`") == "cluster" and slug(" Order and routing") == "order-and-routing"


def test_the_llama_server_path_the_readme_gives_is_where_the_installer_puts_it(llama_server_bin):
    """The README tells a newcomer where `scripts/install-engines llamacpp` puts the binary; the path
    the installer prints (the one the tests run) has that shape."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    (shown,) = re.findall(r"`(~/\.cache/harvest/engines/[^`]*/llama-server)`", readme)
    # From the engines folder on (HARVEST_ENGINES may move the folder itself).
    tail = shown.split("/engines/", 1)[1]
    pattern = r".*/" + re.escape(tail).replace(re.escape("python3.X"), r"python3\.\d+")
    assert re.fullmatch(pattern, llama_server_bin), (shown, llama_server_bin)
    assert Path(llama_server_bin).is_file() and os.access(llama_server_bin, os.X_OK)
