"""The documentation holds together (issue 29, "the README as a guide"): the
README is a short first page and the reference lives in ``docs/*.md``, so
what the old one-page README checked by being one page is checked here:
every relative link (and ``#anchor``) in README.md and docs/*.md reaches a
file and a heading, every dependency in ``pyproject.toml`` is explained in
docs/dependencies.md, every ``aep-bridges`` command is in docs/cli.md, the
README's test command is CI's, and the README says ``AEP-Version: 0.1``
where it first shows ``POST /events``. The knob tables have their own test
(``tests/unit/supervisor/test_knobs.py``)."""
from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import pytest

from supervisor import cli
from tests.support.shared import ROOT, shared_dir

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~)")
HEADING = re.compile(r"^(#{1,6}) +(.+?) *#*$")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)\)")


def _prose(text: str) -> list[str]:
    """The lines of ``text`` outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: links reduced to their text,
    lower case, everything but letters, digits, ``_``, ``-`` and spaces
    dropped, spaces to ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor a page's headings make (a repeated one gets ``-1``, ``-2``...)."""
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(page.read_text()):
        m = HEADING.match(line)
        if not m:
            continue
        s = slug(m.group(2))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def links(page: Path) -> list[str]:
    """The link targets of a page's prose (code blocks left out)."""
    return [m.group(1) for line in _prose(page.read_text()) for m in LINK.finditer(line)]


def _resolve(page: Path, target: str, root: Path = ROOT) -> Path:
    """The file a relative link names (lexically: a symlinked checkout
    stays where it is). A link that leaves ``root`` may only go to
    ``../shared`` (the AEP spec beside the checkout), read from wherever the
    tests find it."""
    path = Path(os.path.normpath(page.parent / target)) if target else page
    if path.is_relative_to(root):
        return path
    rel = path.relative_to(root.parent)
    assert rel.parts[0] == "shared", f"{page.name}: {target} leaves the checkout"
    return shared_dir().joinpath(*rel.parts[1:])


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """Each relative link of ``page`` whose file, or whose ``#anchor`` in a
    Markdown file, does not exist, with the reason."""
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):   # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        path = _resolve(page, file, root)
        if not path.exists():
            broken.append(f"{target}: no file {path}")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: no heading #{anchor} in {path.name}")
    return broken


def test_the_slugs_are_githubs():
    assert slug("Observing ACP editors (Zed, JetBrains, Neovim...)") == \
        "observing-acp-editors-zed-jetbrains-neovim"
    assert slug("The demo: `scripts/dev demo`") == "the-demo-scriptsdev-demo"   # "/" goes
    assert slug("Posting events: `POST /events` needs `AEP-Version: 0.1`") == \
        "posting-events-post-events-needs-aep-version-01"


def test_the_reference_pages_exist():
    names = {p.name for p in PAGES}
    assert {"README.md", "bridges.md", "hooks.md", "configuration.md", "operations.md",
            "security.md", "performance.md", "past-one-machine.md", "cli.md",
            "dependencies.md", "stream.md", "console.md", "development.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    broken = broken_links(page)
    assert not broken, f"{page.name}: " + "; ".join(broken)


def test_a_broken_link_and_anchor_are_caught(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## Its part\n")
    page = tmp_path / "README.md"
    page.write_text("# Title\n\n## A `b/c` d\n\n[x](#a-bc-d) [y](#nope) [z](missing.md)\n"
                    "[o](docs/other.md#its-part) [p](docs/other.md#gone) ![i](docs/other.md)\n"
                    "```\n[not a link](inside-code.md)\n```\n")
    assert anchors(page) == {"title", "a-bc-d"}
    assert links(page) == ["#a-bc-d", "#nope", "missing.md", "docs/other.md#its-part",
                           "docs/other.md#gone", "docs/other.md"]
    assert [b.split(":")[0] for b in broken_links(page, tmp_path)] == \
        ["#nope", "missing.md", "docs/other.md#gone"]


def test_every_dependency_is_explained():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"]) + [d for ds in project["optional-dependencies"].values()
                                               for d in ds]
    names = {re.split(r"[\[<>=!~; ]", d, maxsplit=1)[0] for d in wanted}
    table = (ROOT / "docs" / "dependencies.md").read_text()
    missing = sorted(n for n in names if f"`{n}" not in table)
    assert not missing, f"docs/dependencies.md does not explain {missing}"


def test_every_command_is_in_the_cli_reference(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    usage = capsys.readouterr().out
    commands = re.search(r"\{([a-z,]+)\}", usage)
    assert commands, usage
    page = (ROOT / "docs" / "cli.md").read_text()
    missing = [c for c in commands.group(1).split(",") if f"aep-bridges {c}" not in page]
    assert not missing, f"docs/cli.md does not show {missing}"


def test_the_readme_test_command_is_cis():
    readme = (ROOT / "README.md").read_text()
    assert "scripts/dev test" in readme and "scripts/dev check" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert "exec scripts/dev test" in ci


def test_the_readme_says_the_version_header_where_it_first_shows_post_events():
    paragraphs = (ROOT / "README.md").read_text().split("\n\n")
    first = next(p for p in paragraphs if "POST /events" in p)
    assert "AEP-Version: 0.1" in first, first
