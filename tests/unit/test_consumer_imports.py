"""The consumer library's modules import each other in one direction only: no cycles.

Imports inside functions count too: `ConsumerApp.run()` imports the worker late, so the worker
(and the runner under it) must not import the app.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "bandgate.consumers"


def _graph() -> dict[str, set[str]]:
    """Each module of the library (`app`, `runner`...) and the library modules it imports."""
    modules = {path.stem: path for path in (ROOT / "consumers").glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == PACKAGE:
                imported.update(alias.name for alias in node.names if alias.name in modules)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE):
                imported.add((node.module or "").split(".")[2])
            elif isinstance(node, ast.Import):
                imported.update(
                    alias.name.split(".")[2]
                    for alias in node.names
                    if alias.name.startswith(f"{PACKAGE}.")
                )
        graph[name] = imported - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            found.append([*path[path.index(module) :], module])
            return
        if module in done:
            return
        for imported in sorted(graph.get(module, ())):
            visit(imported, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    return found


def test_no_module_of_the_library_imports_itself_back() -> None:
    graph = _graph()
    assert {"app", "worker", "runner", "decision", "scheduling", "settlement"} <= graph.keys()
    assert _cycles(graph) == []


def test_the_check_finds_a_cycle() -> None:
    assert _cycles({"app": {"worker"}, "worker": {"runner"}, "runner": {"app"}}) == [
        ["app", "worker", "runner", "app"]
    ]
