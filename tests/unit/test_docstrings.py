"""Every dotted `bandgate.…` name a docstring gives resolves: a module of the package, or a name
in one. A module that moves takes the docstrings naming it along, or this test says which."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLOORS = ("topology", "core", "gateway", "consumers", "pull", "ops", "testing")
# `bandgate.core.ledger`, or the short form `core.ledger` a docstring writes in backticks; not a
# file name (`bandgate.toml`).
DOTTED = re.compile(
    r"\bbandgate(?:\.[A-Za-z_][A-Za-z0-9_]*)+(?!\.?[A-Za-z])"
    r"|(?<=`)(?:topology|core|gateway|consumers|pull|ops|testing)"
    r"(?:\.[A-Za-z_][A-Za-z0-9_]*)+(?=[`(])"
)
FILES = frozenset({"bandgate.toml"})


def _docstrings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(
            node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
        ) and (text := ast.get_docstring(node, clean=False)):
            found.append((getattr(node, "lineno", 1), text))
    return found


def resolves(name: str) -> bool:
    """Whether `name` is a module, or a module's attribute (chain)."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            found = importlib.util.find_spec(module_name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            continue
        target: object = importlib.import_module(module_name)
        for attribute in parts[cut:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


def _names() -> list[tuple[str, str]]:
    names = []
    for floor in FLOORS:
        for path in sorted((ROOT / floor).rglob("*.py")):
            for line, text in _docstrings(path):
                for name in sorted(set(DOTTED.findall(text)) - FILES):
                    full = name if name.startswith("bandgate.") else f"bandgate.{name}"
                    names.append((f"{path.relative_to(ROOT)}:{line}", full))
    return names


def test_the_docstrings_name_modules_at_all() -> None:
    assert len(_names()) > 30


@pytest.mark.parametrize(("where", "name"), _names(), ids=lambda v: v)
def test_a_dotted_name_in_a_docstring_resolves(where: str, name: str) -> None:
    assert resolves(name), f"{where} names {name}, which does not exist"


def test_the_check_tells_a_moved_module_apart() -> None:
    assert resolves("bandgate.consumers.runner")
    assert resolves("bandgate.consumers.runner.ConsumerRunner.take")
    assert not resolves("bandgate.consumers.pipeline")
    assert not resolves("bandgate.consumers.runner.Pipeline")
