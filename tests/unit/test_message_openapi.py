"""The OpenAPI document of cancel, replace and escalate: their path parameters, the errors only
they answer, and an escalate body schema that asks for exactly one of priority and band."""

from __future__ import annotations

import re
from typing import Any

import jsonschema_rs
import pytest

from bandgate.gateway.openapi import openapi_document

DOCUMENT = openapi_document()
ONE = "/v1/queues/{queue}/messages/{message_id}"
OPERATIONS = [(ONE, "delete"), (ONE, "put"), (f"{ONE}/escalate", "post")]


@pytest.mark.parametrize(("path", "method"), OPERATIONS)
def test_each_names_its_path_parameters_and_needs_publish(path: str, method: str) -> None:
    operation = DOCUMENT["paths"][path][method]
    names = [p["name"] for p in operation["parameters"] if p["in"] == "path"]
    assert names == re.findall(r"{(\w+)}", path)
    assert "publish:{queue}" in operation["description"]
    assert {"403", "404", "422", "503"} <= set(operation["responses"])


def test_only_replace_and_escalate_can_leave_a_tombstone_unwritten() -> None:
    def says(path: str, method: str, status: str, code: str) -> bool:
        text: str = DOCUMENT["paths"][path][method]["responses"][status]["description"]
        return code in text

    assert [says(p, m, "503", "tombstone_not_written") for p, m in OPERATIONS] == [
        False,
        True,
        True,
    ]
    assert [says(p, m, "422", "message_required") for p, m in OPERATIONS] == [False, False, True]
    assert DOCUMENT["paths"][ONE]["delete"]["responses"]["202"]
    assert DOCUMENT["paths"][ONE]["put"]["responses"]["201"]


@pytest.mark.parametrize(
    ("body", "valid"),
    [
        ({"payload": 1, "band": "hot"}, True),
        ({"payload": 1, "priority": 9}, True),
        ({"payload": 1, "priority": "high", "band": None}, True),
        ({"payload": 1, "band": "hot", "priority": None, "delay_seconds": 5}, True),
        ({"payload": 1}, False),
        ({"payload": 1, "band": None, "priority": None}, False),
        ({"payload": 1, "band": "hot", "priority": 9}, False),
        ({"band": "hot"}, False),
        ({"payload": 1, "band": 3}, False),
        ({"payload": 1, "band": "hot", "delay_seconds": 1, "deliver_at": "2030-01-01T00:00:00Z"},
         False),
        ({"payload": 1, "band": "hot", "extra": 1}, False),
    ],
)  # fmt: skip
def test_the_escalate_body_needs_a_payload_and_exactly_one_of_priority_and_band(
    body: dict[str, Any], valid: bool
) -> None:
    root = {"$ref": "#/components/schemas/EscalateRequest", "components": DOCUMENT["components"]}
    assert jsonschema_rs.validator_for(root).is_valid(body) is valid
