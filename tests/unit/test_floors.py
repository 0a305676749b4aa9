"""The floors of the package: every import points down, never up or sideways.

`topology` at the bottom; `core` (broker link, publishing, telemetry) on it; `gateway` (HTTP)
and `consumers` (the worker library) side by side on the core, never importing each other;
`pull` (HTTP pull consumers: a consumer served over the gateway) on both; `ops` (the CLI and
operator tools) on top. The `bandgate` package itself only re-exports.

Size is held at the function, not the module (a module is as long as its concept): ruff's
complexity and size rules, with the ceilings pyproject.toml states, and tighter ones over the
worker library and the HTTP receivers.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "bandgate"

# Each floor and the floors it may import (itself included).
ALLOWED: dict[str, frozenset[str]] = {
    "topology": frozenset({"topology"}),
    "core": frozenset({"topology", "core"}),
    "gateway": frozenset({"topology", "core", "gateway"}),
    "consumers": frozenset({"topology", "core", "consumers"}),
    "pull": frozenset({"topology", "core", "gateway", "consumers", "pull"}),
    "ops": frozenset({"topology", "core", "gateway", "consumers", "pull", "ops"}),
    # The in-memory harness (`bandgate.testing`): on the worker library and the core; nothing
    # imports it but tests.
    "testing": frozenset({"topology", "core", "consumers", "testing"}),
}
FLOORS = tuple(ALLOWED)
OLD_NAMES = frozenset(FLOORS)
SIZE_RULES = ("C901", "PLR0911", "PLR0912", "PLR0913", "PLR0915")
# consumers/ and pull/: the path of a message, read top to bottom, in small functions.
TIGHTER = {"mccabe.max-complexity": 10, "pylint.max-branches": 12, "pylint.max-statements": 40}


def _modules() -> list[tuple[str, Path]]:
    found = []
    for floor in FLOORS:
        for path in sorted((ROOT / floor).rglob("*.py")):
            found.append((floor, path))
    return found


def _imported(path: Path) -> list[tuple[int, str]]:
    """Every module name `path` imports, absolute, with its line."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: relative import"
            names.append((node.lineno, node.module or ""))
    return names


def test_every_floor_is_linked_into_the_package() -> None:
    for floor in FLOORS:
        assert (PACKAGE / floor).resolve() == ROOT / floor


def _violations(floor: str, path: Path) -> list[str]:
    found = []
    for line, name in _imported(path):
        parts = name.split(".")
        if parts[0] in OLD_NAMES:
            found.append(f"{path.name}:{line}: {name} is not under bandgate")
        elif parts[0] == "bandgate" and len(parts) > 1 and parts[1] not in ALLOWED[floor]:
            found.append(f"{path.name}:{line}: {floor} imports {name}")
    return found


@pytest.mark.parametrize(("floor", "path"), _modules(), ids=lambda v: getattr(v, "name", v))
def test_imports_point_down(floor: str, path: Path) -> None:
    assert _violations(floor, path) == []


def test_nothing_outside_the_package_imports_the_old_names() -> None:
    elsewhere = [
        path
        for folder in ("tests", "bench", "examples", "tools", "bandgate")
        for path in (ROOT / folder).glob("**/*.py")
        if folder != "bandgate" or path.parent == PACKAGE
    ]
    assert len(elsewhere) > 50
    for path in elsewhere:
        for line, name in _imported(path):
            assert name.split(".")[0] not in OLD_NAMES, f"{path}:{line}: imports {name}"


def test_ruff_holds_every_function_to_the_size_limits() -> None:
    lint = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert set(SIZE_RULES) <= set(lint["select"])
    assert lint["mccabe"]["max-complexity"] <= 15
    assert lint["pylint"]["max-statements"] <= 55


def test_the_worker_library_and_the_receivers_keep_to_tighter_limits() -> None:
    ruff = Path(sys.executable).with_name("ruff")
    options = [f"--config=lint.{name} = {value}" for name, value in TIGHTER.items()]
    checked = subprocess.run(
        [str(ruff), "check", "--no-cache", "--select=C901,PLR0912,PLR0915", *options]
        + ["consumers", "pull"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout


def test_the_check_catches_sideways_upward_and_old_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import bandgate.topology.model\n"
        "from bandgate.gateway.routes import routes\n"
        "from bandgate.ops import cli\n"
        "import consumers.app\n"
    )
    assert _violations("consumers", module) == [
        "m.py:2: consumers imports bandgate.gateway.routes",
        "m.py:3: consumers imports bandgate.ops",
        "m.py:4: consumers.app is not under bandgate",
    ]
