"""The README stays short and leads to the manual; the manual's nav holds every page.

``make docs`` (mkdocs --strict) checks the links inside docs/; this test needs no mkdocs, so
``make test`` catches a README that grows back or a page that falls out of the nav."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _links(text: str) -> list[str]:
    return [m.split("#")[0] for m in re.findall(r"\]\(([^)\s]+)\)", text)
            if not m.startswith(("http://", "https://", "#"))]


def _nav_pages() -> list[str]:
    return re.findall(r":\s*([\w./-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)


def test_readme_is_short_and_every_link_resolves():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 250
    missing = [t for t in _links(text) if not (ROOT / t).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_every_page_is_in_the_nav_and_every_nav_entry_exists():
    nav = _nav_pages()
    assert len(nav) == len(set(nav)), "a page is listed twice in mkdocs.yml's nav"
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert sorted(set(nav) - pages) == [], "nav entries without a page"
    assert sorted(pages - set(nav)) == [], "pages missing from mkdocs.yml's nav"


def test_the_readme_leads_to_every_user_guide_page():
    """A newcomer finds each capability's page, and the manual's home, from the README."""
    readme = {(ROOT / t).resolve() for t in _links((ROOT / "README.md").read_text())}
    assert (DOCS / "index.md").resolve() in readme
    guide = {p.resolve() for p in (DOCS / "guide").glob("*.md")}
    assert sorted(str(p) for p in guide - readme) == [], "guide pages not linked from README"


def test_every_command_is_listed_where_a_newcomer_looks():
    """README, the manual's home and the command's page list every ``meshshard`` command."""
    from meshshard.cli import _COMMANDS

    for page in (ROOT / "README.md", DOCS / "index.md", DOCS / "guide" / "cli.md"):
        text = page.read_text()
        missing = [c for c in _COMMANDS
                   if not re.search(rf"`{c}`|meshshard {c}\b|\| {c}\b| {c}`", text)]
        assert not missing, f"{page.name} does not list {missing}"


#: development notes that do not belong in a user's page
_DEV_NOTES = ("no time left", "this session", "ran out of time", "next session", "TODO")


def test_user_pages_hold_no_development_notes():
    """(The design pages under docs/design/ keep their dated history.)"""
    pages = [ROOT / "README.md", *(p for p in DOCS.rglob("*.md") if "design" not in p.parts)]
    found = [f"{p.relative_to(ROOT)}: {n!r}" for p in pages for n in _DEV_NOTES
             if n in p.read_text()]
    assert not found, found


def test_the_cli_page_examples_do_not_write_over_each_other():
    """Run in order, the command page's first block works: no two ``partition`` lines write
    the same ``--out`` (the second would be refused without --force)."""
    block = re.search(r"```bash\n(.*?)```", (DOCS / "guide" / "cli.md").read_text(), re.S)
    outs = re.findall(r"meshshard partition .*?--out (\S+)", block.group(1))
    assert len(outs) >= 2 and len(outs) == len(set(outs)), outs
