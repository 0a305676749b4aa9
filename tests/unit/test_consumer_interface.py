"""`bandgate.pull` and the in-memory harness (`bandgate.testing`) drive the worker library
through its public interface only: every name they import from `bandgate.consumers` is one the
package exports (`bandgate.consumers.__all__`, documented in its docstring), imported from the
package itself, never from a module inside; and of a runner they use only what
`RUNNER_INTERFACE` names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import bandgate.consumers
from bandgate.consumers import runner
from bandgate.consumers.runner import RUNNER_INTERFACE, ConsumerRunner

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "bandgate.consumers"


def imports_of_the_library(path: Path) -> list[str]:
    """What `path` imports of the library, as `module:name` (a module alone for `import`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE):
            found += [f"{node.module}:{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.startswith(PACKAGE)]
    return found


def outside_the_interface(imported: list[str]) -> list[str]:
    public = {f"{PACKAGE}:{name}" for name in bandgate.consumers.__all__}
    return [name for name in imported if name not in public]


DRIVERS = ("pull", "testing")  # the packages that drive runners of the worker library


@pytest.mark.parametrize("package", DRIVERS)
def test_drivers_import_only_the_public_interface(package: str) -> None:
    imported = {
        str(path.relative_to(ROOT)): imports_of_the_library(path)
        for path in sorted((ROOT / package).glob("*.py"))
    }
    assert any(imported.values())
    assert {path: outside_the_interface(names) for path, names in imported.items()} == {
        path: [] for path in imported
    }


def test_the_check_catches_a_module_inside_and_a_name_not_exported(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from bandgate.consumers import ConsumerRunner, Delivery\n"
        "from bandgate.consumers.runner import ConsumerRunner as Runner\n"
        "from bandgate.consumers import Dispatcher\n"
        "import bandgate.consumers.scheduling\n"
    )
    assert outside_the_interface(imports_of_the_library(module)) == [
        "bandgate.consumers.runner:ConsumerRunner",
        "bandgate.consumers:Dispatcher",
        "bandgate.consumers.scheduling",
    ]


def runner_attributes(path: Path) -> set[str]:
    """What `path` uses of a runner: attributes of a name or attribute called `runner`."""
    used = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute):
            owner = node.value
            name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", None)
            if name == "runner":  # pull/receiver.py holds its runner as `self.runner`
                used.add(node.attr)
    return used


@pytest.mark.parametrize(
    ("package", "uses"),
    [("pull", {"take", "start", "untake"}), ("testing", {"open", "run", "stop_consuming"})],
)
def test_drivers_use_only_the_runner_interface(package: str, uses: set[str]) -> None:
    used = set().union(*(runner_attributes(path) for path in (ROOT / package).glob("*.py")))
    assert uses <= used
    assert used - RUNNER_INTERFACE == set()


def test_the_runner_interface_is_all_there_and_documented() -> None:
    documented = runner.__doc__ or ""
    for name in RUNNER_INTERFACE:
        assert hasattr(ConsumerRunner, name), name
        assert f"`{name}" in documented, name
