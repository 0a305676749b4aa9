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


def test_the_home_page_shows_the_readmes_first_commands() -> None:
    """docs/index.md opens with the README's first block, which test_readme.py runs."""
    readme = README.read_text(encoding="utf-8").split("\n## ", 1)[0]
    home = (DOCS / "index.md").read_text(encoding="utf-8").split("\n## ", 1)[0]
    assert shell_blocks(home) == shell_blocks(readme)[:1]


def test_the_cluster_pages_rabbitmq_conf_is_what_private_nodes_write() -> None:
    """docs/deploy/cluster.md's `rabbitmq.conf` lines: the key each version range takes and the
    size are those bandgate writes for its own nodes (ops/local_broker.py), which
    test_private_node.py reads back from running 3.10, 4.0 and 4.3 nodes."""
    from bandgate.ops.local_broker import QUORUM_WAL_MAX_SIZE_BYTES, quorum_wal_key

    page = (DOCS / "deploy" / "cluster.md").read_text(encoding="utf-8")
    [block] = re.findall(r"```ini\n(.*?)```", page, re.S)
    said = re.findall(r"# RabbitMQ ([\d.]+)[^\n]*\n([\w.]+) = (\d+)\n", block)
    assert [(version, key) for version, key, _ in said] == [
        ("3.10", quorum_wal_key("4.2")),
        ("4.3", quorum_wal_key("4.3")),
    ]
    assert quorum_wal_key("3.10") == quorum_wal_key("4.2")
    assert {int(size) for _, _, size in said} == {QUORUM_WAL_MAX_SIZE_BYTES}


def test_the_layout_names_folders_that_exist() -> None:
    """docs/explanation/design.md's two layout blocks: the floors' diagram names every floor of
    the package and its import name; the listing names folders of this checkout."""
    from tests.unit.test_floors import FLOORS

    design = (DOCS / "explanation" / "design.md").read_text(encoding="utf-8")
    floors, listing = re.findall(r"```\n(.*?)```", design, re.S)[:2]
    shown = re.findall(r"\b(\w+)/\s+bandgate\.(\w+)\b", floors)
    assert sorted(shown) == sorted((floor, floor) for floor in FLOORS)
    folders = re.findall(r"^(\w+)/ ", listing, re.M)
    assert len(folders) >= 5
    assert [f for f in folders if not (ROOT / f).is_dir()] == []
