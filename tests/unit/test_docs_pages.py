"""The README stays a first screen (at most 150 lines) whose walk-through is the tutorial's, its
links land on pages and headings that exist, and every page of docs/ is in the site's nav.
`make docs` (strict) checks the links inside docs/; the README is outside it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def section(path: Path, title: str) -> str:
    text = path.read_text(encoding="utf-8")
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def shell_blocks(markdown: str) -> list[str]:
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", markdown, flags=re.S)]


def slug(heading: str) -> str:
    """The anchor Python-Markdown's toc gives a heading (its default slugify)."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.M)}


def test_the_readme_is_at_most_150_lines() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 150


def test_the_tutorial_walks_the_readmes_commands() -> None:
    """test_readme.py runs the README's; the tutorial shows the very same, in the same order."""
    readme = shell_blocks(section(README, "First steps"))
    assert len(readme) >= 5
    assert shell_blocks(section(DOCS / "tutorial.md", "First steps")) == readme


def _readme_links() -> list[str]:
    text = README.read_text(encoding="utf-8")
    return [t for t in re.findall(r"\]\(([^)]+)\)", text) if not t.startswith("http")]


@pytest.mark.parametrize("target", _readme_links())
def test_a_readme_link_lands(target: str) -> None:
    path, _, anchor = target.partition("#")
    assert (ROOT / path).exists(), target
    if anchor:
        assert anchor in anchors(ROOT / path), target


def _nav_pages(entries: list[object]) -> set[str]:
    pages: set[str] = set()
    for entry in entries:
        values = entry.values() if isinstance(entry, dict) else [entry]
        for value in values:
            pages |= _nav_pages(value) if isinstance(value, list) else {str(value)}
    return pages


def test_every_page_is_in_the_nav() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    nav = _nav_pages(config["nav"])
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages - nav == set(), "add them to mkdocs.yml's nav"
    assert nav - pages == set()


def test_the_console_refreshes_as_often_as_its_page_and_the_docs_say() -> None:
    """One figure a user can time: the page polls every N ms, the gateway samples every N s,
    and the page's footer and the docs say N s."""
    from bandgate.gateway.console_sampler import SAMPLE_INTERVAL_SECONDS

    assets = ROOT / "gateway" / "console_assets"
    [poll_ms] = re.findall(r"setInterval\(poll, (\d+)\)", (assets / "console.js").read_text())
    seconds = int(poll_ms) / 1000
    assert seconds == SAMPLE_INTERVAL_SECONDS
    said = f"{seconds:g} s"
    assert f"Refreshes every {said}." in (assets / "console.html").read_text()
    docs = " ".join((DOCS / "guides" / "observability.md").read_text().split())
    assert f"It refreshes every {said}." in docs
    assert f"sampled every {said} while a console is open" in docs


def test_every_topology_example_of_the_docs_loads() -> None:
    """A ```toml block of a page is a whole topology file that bandgate accepts (the tutorial's
    is bandgate.toml itself, included)."""
    import tomllib

    from bandgate.topology.model import Topology

    blocks = [
        (path, block)
        for path in sorted(DOCS.rglob("*.md"))
        for block in re.findall(r"```toml\n(.*?)```", path.read_text(encoding="utf-8"), re.S)
        if not block.startswith("--8<--")
    ]
    assert len(blocks) >= 2
    for path, block in blocks:
        try:
            Topology.model_validate(tomllib.loads(block))
        except ValueError as error:  # a TOML or a validation error
            pytest.fail(f"{path.relative_to(ROOT)}: {error}")
