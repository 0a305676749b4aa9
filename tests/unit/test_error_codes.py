"""One registry of error codes (`bandgate.core.error_codes`): every code the code base raises is
in it, with the status it is raised with; the Python producer's failures, the OpenAPI
document's error responses and the docs' error tables say what it says (the reference table of
docs/reference/errors.md is printed from the registry: tests/unit/test_docs_reference.py)."""

from __future__ import annotations

import ast
import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import bandgate
from bandgate.core import error_codes
from bandgate.core import publish_outcomes as outcomes
from bandgate.core.error_codes import REGISTRY, Kind
from bandgate.gateway.errors import ApiError
from bandgate.gateway.openapi import openapi_document
from bandgate.pull.app import PullExtension
from bandgate.pull.settings import PullSettings
from bandgate.topology.publish_input import InputRule
from tests.unit.test_floors import FLOORS, ROOT

ERRORS_PAGE = ROOT / "docs" / "reference" / "errors.md"
PUBLISH_HTTP_PAGE = ROOT / "docs" / "guides" / "publish-http.md"
PUBLISH_PYTHON_PAGE = ROOT / "docs" / "guides" / "publish-python.md"
CODE = re.compile(r"^[a-z][a-z_]*[a-z]$")


def _sources() -> Iterator[tuple[Path, ast.AST]]:
    for floor in FLOORS:
        for path in sorted((ROOT / floor).rglob("*.py")):
            yield path, ast.parse(path.read_text(), str(path))


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    return ""


def _text(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


# Where a code is written as a string: the call, and the position or keyword of its code.
CODE_ARGUMENTS = {
    "ApiError": (1, "code"),
    "InvalidMessage": (2, "code"),
    "StatsError": (0, "code"),
}


def _argument(call: ast.Call, position: int, keyword: str) -> ast.expr | None:
    if len(call.args) > position:
        return call.args[position]
    return next((k.value for k in call.keywords if k.arg == keyword), None)


def written_codes() -> list[tuple[str, str, int | None]]:
    """Every code written as a string literal in the package, where it is written, and the
    status written with it (`ApiError(status, code, ...)`, `{"status": ..., "error": {...}}`)."""
    found: list[tuple[str, str, int | None]] = []
    for path, tree in _sources():
        where = str(path.relative_to(ROOT))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                called = _name(node.func).rsplit(".", 1)[-1]
                if called in CODE_ARGUMENTS:
                    code = _text(_argument(node, *CODE_ARGUMENTS[called]))
                    status = None
                    if called == "ApiError" and isinstance(node.args[0], ast.Constant):
                        status = int(node.args[0].value)  # type: ignore[arg-type]
                    if code is not None:
                        found.append((code, f"{where}:{node.lineno}", status))
            elif isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    code = _text(value)
                    if key is not None and _text(key) == "code" and code is not None:
                        found.append((code, f"{where}:{node.lineno}", None))
            elif isinstance(node, ast.Assign):
                targets = [_name(target) for target in node.targets]
                code = _text(node.value)
                if "code" in targets and code is not None:
                    found.append((code, f"{where}:{node.lineno}", None))
    return found


def test_the_scan_finds_codes_where_they_are_written() -> None:
    """The scan below would pass on finding nothing: it does find the codes written today."""
    places = {where.split(":")[0] for _, where, _ in written_codes()}
    assert {"pull/service.py", "core/queue_stats.py", "core/publishing.py"} <= places


def test_every_code_written_in_the_package_is_registered_with_its_status() -> None:
    unregistered = [
        f"{where}: {code}" for code, where, _ in written_codes() if code not in REGISTRY
    ]
    assert unregistered == []
    misfiled = [
        f"{where}: {code} answered {status}, registered {REGISTRY[code].status}"
        for code, where, status in written_codes()
        if status is not None and REGISTRY[code].status != status
    ]
    assert misfiled == []


def test_routes_raise_registered_codes_by_name() -> None:
    """`ApiError.of` takes an `ErrorCode`, never a string; the bottom floor raises no code."""
    for path, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _name(node.func).endswith("ApiError.of"):
                assert _text(node.args[0]) is None, f"{path}:{node.lineno}"
    bottom = (ROOT / "topology" / "publish_input.py").read_text()
    assert not [code for code in REGISTRY if f'"{code}"' in bottom]


def test_an_unregistered_code_is_refused() -> None:
    with pytest.raises(KeyError, match="not_a_code"):
        ApiError(400, "not_a_code", "no")
    assert ApiError.of(error_codes.QUEUE_FULL, "full").status == 429


def test_the_registry_is_well_formed() -> None:
    for code, error in REGISTRY.items():
        assert code == error.code
        assert CODE.match(code), code
        assert getattr(error_codes, code.upper()) is error
        assert error.meaning
        assert not error.meaning.endswith(".")
        if error.status is not None:
            assert 400 <= error.status < 600
        if error.kind is Kind.OUTCOME_UNKNOWN:
            assert (error.status or 0) >= 500, code
    assert set(error_codes.for_rule(rule) for rule in InputRule) <= set(REGISTRY.values())


def _failures() -> list[type[outcomes.PublishFailure]]:
    found = []
    pending: list[type[outcomes.PublishFailure]] = [outcomes.PublishFailure]
    while pending:
        failure = pending.pop()
        found.append(failure)
        pending += failure.__subclasses__()
    return found


def test_every_publish_failure_has_a_registered_code_of_its_kind() -> None:
    for failure in _failures():
        assert REGISTRY[failure.code] is failure.error, failure
        if issubclass(failure, outcomes.OutcomeUnknown):
            assert failure.error.kind is Kind.OUTCOME_UNKNOWN, failure
        elif issubclass(failure, outcomes.NotEnqueued):
            assert failure.error.kind is not Kind.OUTCOME_UNKNOWN, failure


def test_a_failure_of_the_wrong_kind_fails_when_it_is_defined() -> None:
    with pytest.raises(TypeError, match="confirm_timeout"):

        class Wrong(outcomes.NotEnqueued):
            error = error_codes.CONFIRM_TIMEOUT

    with pytest.raises(ValueError, match="confirm_lost"):
        outcomes.InvalidMessage("no", "field", error_codes.CONFIRM_LOST)
    assert outcomes.InvalidMessage("no", "f", "invalid_priority").error.status == 422


def _responses(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            for status, response in operation["responses"].items():
                if int(status) >= 400:
                    yield f"{method} {path}", status, response


def _with_receivers() -> dict[str, Any]:
    """The gateway's document with the HTTP receivers' operations added, as their app adds
    them."""
    document = copy.deepcopy(openapi_document())
    PullExtension(PullSettings()).document(document)
    return document


def test_the_openapi_error_responses_come_from_the_registry() -> None:
    seen = 0
    for operation, status, response in _responses(_with_receivers()):
        codes = response["x-error-codes"]
        assert codes, (operation, status)
        for code in codes:
            error = REGISTRY[code]
            assert error.status == int(status), (operation, status, code)
            assert f"{code}" in response["description"]
            assert error.meaning in response["description"]
            seen += 1
    assert seen > 300  # the receivers' operations are counted too


def _table(page: Path, heading: str) -> list[list[str]]:
    """The rows of the first table after `heading`, cells split (the header row dropped)."""
    section = page.read_text(encoding="utf-8").split(heading, 1)[1]
    lines = [line for line in section.split("\n\n", 2)[1].splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def _codes(cell: str) -> list[str]:
    """The codes a cell names, each in backticks; a name the registry lacks fails the test."""
    codes = re.findall(r"`([a-z_]+)`", cell)
    assert set(codes) <= set(REGISTRY), set(codes) - set(REGISTRY)
    return codes


def test_the_docs_error_table_holds_every_code_under_its_status() -> None:
    listed: dict[str, set[int]] = {}
    for status_cell, cell, _ in _table(ERRORS_PAGE, "Every error is "):
        codes = re.sub(r"\([^()]*\)", "", cell)  # what is in parentheses explains
        statuses = [int(status) for status in re.findall(r"\d{3}", status_cell)]
        for code in _codes(codes):
            listed[code] = set(statuses)
            assert REGISTRY[code].status in statuses, code
        # "not enqueued: `a`, `b`; outcome unknown: `c`" says each one's kind
        for kind in (Kind.NOT_ENQUEUED, Kind.OUTCOME_UNKNOWN):
            for said in re.findall(rf"{kind}: ([^;|]*)", codes):
                assert {REGISTRY[code].kind for code in _codes(said)} == {kind}, said
    answered = {
        code
        for code, error in REGISTRY.items()
        if error.status is not None and error is not error_codes.CLIENT_DISCONNECTED
    }
    assert set(listed) == answered


def _kind_said(cell: str) -> set[Kind]:
    if cell.startswith(("**unknown**", "unknown")):
        return {Kind.OUTCOME_UNKNOWN}
    assert cell.startswith("no"), cell
    return {Kind.NOT_ENQUEUED, Kind.CLIENT_ERROR}


def test_the_docs_publish_failure_tables_agree_with_the_registry() -> None:
    for answer, in_queue, _ in _table(PUBLISH_HTTP_PAGE, "## When a publish fails"):
        for status, code in re.findall(r"`(\d{3}) ([a-z_]+)`", answer):
            assert REGISTRY[code].status == int(status), code
        for code in _codes(answer):
            assert REGISTRY[code].kind in _kind_said(in_queue), code
    for exceptions, in_queue, _ in _table(
        PUBLISH_PYTHON_PAGE, "Every failure is a `PublishFailure`"
    ):
        for name, code in re.findall(r"`([A-Z]\w+)` \(`([a-z_]+)`", exceptions):
            failure = getattr(bandgate, name)
            assert failure.code == code, name
        for code in _codes(exceptions):
            assert REGISTRY[code].kind in _kind_said(in_queue), code
