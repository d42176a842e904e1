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
