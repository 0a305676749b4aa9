"""Every fenced code block of README.md and docs/ is run by a test or says why not (issue 34,
"every example runs"). The line before a block (blank lines aside) says which:

- `<!-- runs: tests/integration/test_docs_examples.py::test_name -->`: that test runs (or, for
  a file's contents, checks) the block. The test must exist, and its module must name the page
  (`tenants.md`), or the file the block includes (`examples/worker.py`), or read every page
  (`rglob("*.md")`): a test that never opens the page cannot be running its block.
- `<!-- not run: needs a Docker engine -->`: a command this machine cannot run, and why.
- `<!-- not a command: a diagram -->`: a diagram, a listing, printed output.

Blocks between `<!-- reference:NAME -->` markers are printed from the code and checked by
tests/unit/test_docs_reference.py. The README's marks, and those of pages others are editing,
are kept in `MARKS` below instead.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tools import docs_reference

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
MARK = re.compile(r"^<!-- (?P<kind>runs|not run|not a command): (?P<what>.+?) -->$")
REFERENCE = re.compile(r"^<!-- (?P<end>/?)reference:(?P<name>[\w-]+) -->$")
INCLUDE = re.compile(r'^--8<-- "(?P<path>[^"]+)"$')
TEST_README = (
    "tests/integration/test_readme.py::"
    "test_first_steps_run_as_written_in_a_second_shell_and_after_a_restart"
)

# (page, how a block's first line starts) -> its mark, for the README (each line counts against
# its 150) and for pages others are editing now (consume-http.md).
README_RUN = f"runs: {TEST_README}"
MARKS = {
    ("README.md", "make run    #"): f"{README_RUN} (`make test` is the suite itself)",
    ("README.md", "source .venv/bin/activate"): README_RUN,
    ("README.md", "curl -s localhost:8000/v1/queues/orders/messages"): README_RUN,
    ("README.md", "EXAMPLE_STOCK=1000 bandgate worker"): README_RUN,
    ("README.md", "bandgate dlq replay orders"): README_RUN,
    ("docs/guides/consume-http.md", "curl -XPOST localhost:8000/v1/queues/orders/receive"): (
        "runs: tests/integration/test_docs_examples.py::test_consuming_over_http_as_the_page_shows"
    ),
    ("docs/guides/consume-http.md", '--8<-- "examples/http_worker.mjs"'): (
        "runs: tests/integration/test_http_worker_example.py::"
        "test_the_node_worker_handles_a_backlog"
    ),
    ("docs/guides/consume-http.md", '{"messages": [...], "ack": {'): (
        "not a command: the shape of a receive's answer that carried acks"
    ),
    ("docs/guides/consume-http.md", "QUEUE=orders BANDGATE_GATEWAY_URL="): (
        "runs: tests/integration/test_docs_examples.py::"
        "test_receiving_from_a_shell_as_the_page_shows"
    ),
}


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    first: str  # the block's first line, stripped
    mark: str | None  # the comment before it, without <!-- -->
    reference: str | None  # the generated section it sits in

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The page's fenced blocks, each with the mark before it and the reference it sits in."""
    found: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    reference: str | None = None
    before = ""  # the last non-blank line outside a block
    index = 0
    while index < len(lines):
        line = lines[index].strip()
        if ref := REFERENCE.match(line):
            reference = None if ref["end"] else ref["name"]
        opening = FENCE.match(lines[index])
        if opening is None:
            before = line or before
            index += 1
            continue
        end = closing(lines, index, opening["fence"])
        body = [text.strip() for text in lines[index + 1 : end]]
        first = next((text for text in body if text), "")
        mark = before[5:-4] if MARK.match(before) else None
        found.append(Block(str(page.relative_to(ROOT)), index + 1, first, mark, reference))
        before = ""
        index = end + 1
    return found


def closing(lines: list[str], start: int, fence: str) -> int:
    for index in range(start + 1, len(lines)):
        text = lines[index].strip()
        if text.startswith(fence) and set(text) == {fence[0]}:
            return index
    raise AssertionError(f"an unclosed fence at line {start + 1}")


def every_block() -> list[Block]:
    return [block for page in PAGES for block in blocks(page)]


def kept_mark(block: Block) -> str | None:
    marks = [
        mark
        for (page, start), mark in MARKS.items()
        if page == block.page and block.first.startswith(start)
    ]
    return marks[0] if marks else None


def mark_of(block: Block) -> str | None:
    pending_mark = kept_mark(block)
    assert not (pending_mark and block.mark), (
        f"{block.where}: marked on the page: drop its MARKS entry"
    )
    return pending_mark or block.mark


def test_the_parser_finds_the_blocks_and_their_marks() -> None:
    """Else every check below would pass on nothing."""
    found = every_block()
    assert len(found) >= 50
    assert sum(block.reference is not None for block in found) >= 20
    readme = [block for block in found if block.page == "README.md"]
    assert len(readme) >= 7
    assert all(mark_of(block) for block in readme)
    assert sum(block.mark is not None for block in found) >= 20


@pytest.mark.parametrize("block", every_block(), ids=lambda block: block.where)
def test_every_block_is_run_by_a_test_or_says_why_not(block: Block) -> None:
    if block.reference is not None:
        assert block.reference in docs_reference.SECTIONS, block.where
        return
    mark = mark_of(block)
    assert mark, (
        f"{block.where} ({block.first!r}): write before it `<!-- runs: tests/...py::test_... -->`"
        ", `<!-- not run: why -->` or `<!-- not a command: what it is -->`"
    )
    kind, _, what = mark.partition(": ")
    if kind == "runs":
        check_runs(block, what)
    else:
        assert len(what.split()) >= 2, f"{block.where}: say why in a few words"


def check_runs(block: Block, target: str) -> None:
    path, _, name = target.split()[0].partition("::")  # a note in parentheses may follow
    module = ROOT / path
    assert path.startswith("tests/"), f"{block.where}: {path} is not a test"
    assert module.is_file(), f"{block.where}: no {path}"
    source = module.read_text(encoding="utf-8")
    defined = {
        node.name
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    assert name.startswith("test"), f"{block.where}: {name} is not a test"
    assert name in defined, f"{block.where}: no {name} in {path}"
    included = INCLUDE.match(block.first)
    names = [Path(block.page).name, 'rglob("*.md")']
    if included:
        names += [included["path"], included["path"].removesuffix(".py").replace("/", ".")]
    assert any(text in source for text in names), (
        f"{block.where}: {path} never opens {Path(block.page).name}: it cannot be running it"
    )


def test_every_mark_kept_here_still_has_its_block() -> None:
    found = {(block.page, block.first) for block in every_block()}
    for page, start in MARKS:
        assert any(p == page and first.startswith(start) for p, first in found), (page, start)
