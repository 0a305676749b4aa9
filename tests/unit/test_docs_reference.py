"""The reference pages (docs/reference/) hold exactly what `tools.docs_reference` prints from the
code, and the code leaves nothing without words: every setting and every key of the topology
file has a description, every command and option a help text, every metric defined anywhere a
line on the metrics page, every error code its meaning. When a block is stale, `python -m
tools.docs_reference` rewrites it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bandgate.core.error_codes import REGISTRY
from tests.unit.test_floors import FLOORS, ROOT
from tools import docs_reference

METRIC_CLASSES = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}


@pytest.mark.parametrize("name", sorted(docs_reference.SECTIONS))
def test_the_reference_page_is_what_the_code_prints(name: str) -> None:
    page = docs_reference.SECTIONS[name][0]
    assert docs_reference.block(name) == docs_reference.rendered(name), (
        f"docs/reference/{page} is stale: run `python -m tools.docs_reference`"
    )


def test_every_setting_has_a_description() -> None:
    missing = [
        f"{cls.__name__}: {setting.variable}"
        for _, cls in docs_reference.settings_classes()
        for setting in docs_reference.settings_of(cls)
        if not setting.description.strip()
    ]
    assert not missing, "add description= to these Fields"


def test_every_key_of_the_topology_file_has_a_description() -> None:
    missing = [
        f"{cls.__name__}.{name}"
        for _, cls in docs_reference.topology_tables()
        for name, field in cls.model_fields.items()
        if not (field.description or "").strip()
    ]
    assert not missing, "add description= to these Fields of topology/model.py"


def test_every_name_of_the_python_api_and_its_methods_have_a_docstring() -> None:
    missing = []
    for dotted, obj in docs_reference.python_names():
        own = vars(obj).get("__doc__") if isinstance(obj, type) else obj.__doc__
        if not (own or "").strip():
            missing.append(dotted)
        if isinstance(obj, type):
            missing += [f"{dotted}.{n}" for n, m in docs_reference.members(obj) if not m.__doc__]
    assert not missing


def test_every_command_argument_and_option_has_help() -> None:
    missing = []
    found = 0
    for command in docs_reference.commands():
        found += 1
        name = " ".join(command.path)
        if not (command.command.help or "").strip():
            missing.append(name)
        missing += [f"{name} {p.name}" for p in command.command.params if not p.help]
    assert found >= 20  # the walk found the commands, groups included
    assert not missing


def _metric_names_in_code() -> set[str]:
    """The first argument of every Counter/Gauge/Histogram/... built anywhere in the package."""
    names = set()
    for floor in FLOORS:
        for path in sorted((ROOT / floor).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not (isinstance(node, ast.Call) and node.args):
                    continue
                func = node.func
                called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                first = node.args[0]
                if called in METRIC_CLASSES and isinstance(first, ast.Constant):
                    names.add(str(first.value))
    return names


def test_every_metric_defined_in_the_code_is_on_the_metrics_page() -> None:
    in_code = _metric_names_in_code()
    assert "bandgate_wait_seconds" in in_code  # the scan sees the definitions
    page = (ROOT / "docs" / "reference" / "metrics.md").read_text()
    missing = {
        name for name in in_code if f"`{name}`" not in page and f"`{name}_total`" not in page
    }
    assert not missing, "define them in core.telemetry.Telemetry, then rerun the generator"


def test_every_error_code_has_a_meaning_and_a_row() -> None:
    page = Path(ROOT / "docs" / "reference" / "errors.md").read_text()
    for code, error in REGISTRY.items():
        assert error.meaning.strip(), code
        assert f"| `{code}` |" in page, code
