"""docs/explanation/guarantees.md: every guarantee names the tests that check it, each test
exists, and the RabbitMQ versions it says are the ones the test runs on (a file marked
`broker_independent` runs on the installed broker only; any other integration test on 3.10, 4.0
and 4.3; a unit test on none). Every test file named anywhere in the docs or the README exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "explanation" / "guarantees.md"
TEST_FILE = re.compile(r"`(?:tests/(?:unit|integration|browser)/)?(test_\w+\.py)`")


def sections() -> dict[str, str]:
    parts = re.split(r"^## (.+)$", PAGE.read_text(encoding="utf-8"), flags=re.M)[1:]
    return dict(zip(parts[::2], parts[1::2], strict=True))


def files_named(name: str) -> list[Path]:
    return sorted((ROOT / "tests").rglob(name))


def where_it_runs(name: str) -> str:
    """ "all" (3.10, 4.0 and 4.3), "installed" (broker_independent) or "unit" (no broker)."""
    found = files_named(name)
    integration = [p for p in found if p.parent.name in ("integration", "browser")]
    if not integration:
        return "unit"
    marked = any("broker_independent" in p.read_text(encoding="utf-8") for p in integration)
    return "installed" if marked else "all"


SAYS = {
    "all": "on 3.10, 4.0 and 4.3",
    "installed": "on the installed broker only",
    "unit": "a unit test: no broker",
}


def test_the_page_has_the_guarantees() -> None:
    assert len(sections()) >= 10


@pytest.mark.parametrize("title", sorted(sections()))
def test_each_guarantee_names_its_tests_and_their_versions(title: str) -> None:
    text = sections()[title]
    assert "*Checked by*" in text, title
    checked = text.split("*Checked by*", 1)[1]
    named = TEST_FILE.findall(checked)
    assert named, title
    for name in named:
        assert files_named(name), f"{title}: {name} does not exist"
        said = SAYS[where_it_runs(name)]
        # The first versions said after the test's name, in its paragraph, are its own.
        after = " ".join(checked.split(f"`{name}`", 1)[1].split("\n\n", 1)[0].split())
        first = (
            min((after.find(s), s) for s in SAYS.values() if s in after)[1]
            if any(s in after for s in SAYS.values())
            else None
        )
        assert first == said, f"{title}: {name} runs {said!r}, the page says {first!r}"


def _documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("path", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_test_file_a_document_names_exists(path: Path) -> None:
    for name in TEST_FILE.findall(path.read_text(encoding="utf-8")):
        assert files_named(name), f"{path.relative_to(ROOT)} names {name}, which does not exist"
