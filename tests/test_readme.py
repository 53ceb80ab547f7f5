"""The README is a newcomer's page: at most 300 lines, opening with the two commands (`make run`,
`make test`: CI runs the README's test command), and a way into every page under docs/. Every
relative link in the README and in docs/*.md points at a file or folder that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
# [text](target) and ![alt](target), outside code spans and fenced blocks.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code spans (examples, not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def relative_links(page: Path) -> list[str]:
    return [t for t in LINK.findall(prose(page.read_text()))
            if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def test_the_readme_is_at_most_300_lines():
    count = len(README.read_text().splitlines())
    assert count <= 300, f"README.md has {count} lines; move detail under docs/ and link it"


def test_the_readme_opens_with_the_two_commands():
    first_block = re.search(r"^```sh\n(.*?)^```", README.read_text(), flags=re.S | re.M)
    assert first_block, "README.md has no sh block"
    commands = [line.split("#")[0].strip() for line in first_block[1].splitlines()]
    assert commands[:2] == ["make run", "make test"], commands


def test_every_relative_link_points_at_something_that_exists():
    broken = [f"{page.relative_to(ROOT)}: {target}" for page in PAGES for target in relative_links(page)
              if not (page.parent / target.split("#")[0]).exists()]
    assert not broken, broken


def test_every_page_under_docs_is_linked_from_the_readme():
    linked = {(ROOT / t.split("#")[0]).resolve() for t in relative_links(README)}
    unlinked = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


def test_the_link_check_sees_a_broken_link(tmp_path):
    """The check itself: a link to a missing file is found, one inside a code span is not."""
    page = tmp_path / "page.md"
    page.write_text("See [the API](api.md), `[not a link](nowhere.md)` and [a site](https://example.com).\n")
    assert relative_links(page) == ["api.md"]
    assert not (page.parent / "api.md").exists()
