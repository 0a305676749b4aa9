"""The receivers' part of the OpenAPI document: their routes in it, their errors in the one
shape, and request schemas that accept what the handlers accept and refuse what they refuse.

The document is built as the app serves it (`bandgate.gateway.routes.openapi`): the gateway's,
copied, with the app's extension adding its part. The handlers are the real ones, called
with a request of a token that may consume, in front of `Receivers` that take whatever reaches
them: a body accepted here passed every check the edge makes.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import jsonschema_rs
import pytest
import schemathesis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bandgate.gateway.api_docs import DOCS_PATHS
from bandgate.gateway.auth import Authenticator, Principal
from bandgate.gateway.console import CONSOLE_PATHS
from bandgate.gateway.errors import ApiError
from bandgate.gateway.openapi import ApiLimits, openapi_document
from bandgate.gateway.settings import GatewaySettings
from bandgate.pull import routes
from bandgate.pull.app import PullExtension, create_app
from bandgate.pull.openapi import RECEIPT_FORM
from bandgate.pull.receipts import ReceiptError, Signer, parse
from bandgate.pull.settings import PullSettings
from bandgate.topology.loader import parse_topology

TOPOLOGY = parse_topology({"delay": {"base_ms": 50, "levels": 12}, "queues": {"orders": {}}})
SETTINGS = GatewaySettings(amqp_url="amqp://guest:guest@127.0.0.1:1/")
PULL = PullSettings(max_leases_per_token=77, default_visibility_seconds=45)
GATEWAY_DOCUMENT = openapi_document(ApiLimits.of(SETTINGS, TOPOLOGY))  # delays up to 204.75 s
DOCUMENT = copy.deepcopy(GATEWAY_DOCUMENT)
PullExtension(PULL).document(DOCUMENT)
METHODS = {"get", "post", "put", "delete"}
ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}
RECEIVERS = {
    ("/v1/queues/{queue}/receive", "post"),
    ("/v1/queues/{queue}/receipts/{receipt}", "delete"),
    ("/v1/queues/{queue}/receipts/ack", "post"),
    ("/v1/queues/{queue}/receipts/release", "post"),
    ("/v1/queues/{queue}/receipts/extend", "post"),
}


def operation(path: str, method: str) -> dict[str, Any]:
    found: dict[str, Any] = DOCUMENT["paths"][path][method]
    return found


def test_the_document_is_valid_openapi_3_1() -> None:
    schemathesis.openapi.from_dict(DOCUMENT).validate()


def test_every_route_the_app_serves_is_documented_and_nothing_else() -> None:
    app = create_app(SETTINGS, TOPOLOGY, pull=PULL)
    served = {
        (re.sub(r":\w+}", "}", route.path), method.lower())  # a convertor ({id:path}) aside
        for route in app.routes
        if isinstance(route, Route) and route.path not in CONSOLE_PATHS | DOCS_PATHS
        for method in route.methods or ()
        if method != "HEAD"
    }
    documented = {
        (path, method)
        for path, item in DOCUMENT["paths"].items()
        for method in item
        if method in METHODS
    }
    assert served == documented
    assert documented >= RECEIVERS


def test_the_gateways_own_document_is_left_as_it_was() -> None:
    assert not {path for path, _ in RECEIVERS} & set(GATEWAY_DOCUMENT["paths"])
    assert "ReceiveRequest" not in GATEWAY_DOCUMENT["components"]["schemas"]
    assert openapi_document(ApiLimits.of(SETTINGS, TOPOLOGY)) is GATEWAY_DOCUMENT


@pytest.mark.parametrize(("path", "method"), sorted(RECEIVERS))
def test_each_receiver_needs_a_token_that_may_consume_and_documents_its_errors(
    path: str, method: str
) -> None:
    found = operation(path, method)
    assert found["security"] == [{"bearer": []}]
    assert "consume:{queue}" in found["description"]
    assert [p["name"] for p in found["parameters"] if p["in"] == "path"] == re.findall(
        r"{(\w+)}", path
    )
    responses = found["responses"]
    expected = {"401", "403", "404", "408", "429", "431", "500", "503"}
    if "requestBody" in found:
        expected |= {"400", "413", "415", "422"}
    if "/receipts/" in path and not path.endswith("/ack"):
        expected |= {"410", "422"}  # one receipt: gone, or not one this API issued
    errors = {status for status in responses if int(status) >= 400}
    assert errors == expected
    for status in errors:
        assert responses[status]["content"]["application/json"]["schema"] == ERROR_REF
        assert responses[status]["description"]
    for status, header in (("401", "WWW-Authenticate"), ("429", "Retry-After")):
        assert header in responses[status]["headers"]
    assert "consume:<queue>" in responses["403"]["description"]


def test_the_answers_and_what_their_errors_say() -> None:
    def answer(path: str, method: str, status: str) -> dict[str, Any]:
        found: dict[str, Any] = operation(path, method)["responses"][status]
        return found

    receive = answer("/v1/queues/{queue}/receive", "post", "200")
    assert receive["content"]["application/json"]["schema"]["$ref"].endswith("ReceiveResponse")
    assert set(receive["links"]) == {"ack", "ack_batch", "release", "extend"}
    assert "content" not in answer("/v1/queues/{queue}/receipts/{receipt}", "delete", "204")
    too_many = answer("/v1/queues/{queue}/receive", "post", "429")["description"]
    assert "too_many_leases" in too_many
    assert "77 leases" in too_many
    assert "45 s" in operation("/v1/queues/{queue}/receive", "post")["description"]
    for path in ("receipts/ack", "receive"):
        assert (
            "batch_too_large"
            in answer(f"/v1/queues/{{queue}}/{path}", "post", "413")["description"]
        )
    for path in ("release", "extend"):
        gone = answer(f"/v1/queues/{{queue}}/receipts/{path}", "post", "410")["description"]
        assert "lease_expired" in gone
        assert "lease_lost" in gone
        invalid = answer(f"/v1/queues/{{queue}}/receipts/{path}", "post", "422")["description"]
        assert "invalid_receipt" in invalid
    assert (
        "conflicting_fields"
        in answer("/v1/queues/{queue}/receipts/release", "post", "422")["description"]
    )
    unavailable = answer("/v1/queues/{queue}/receipts/extend", "post", "503")["description"]
    assert "holder_unresponsive" in unavailable


def test_the_links_lead_to_operations_of_the_document() -> None:
    ids = {
        operation(path, method)["operationId"]: operation(path, method)
        for path, method in RECEIVERS
    }
    links = operation("/v1/queues/{queue}/receive", "post")["responses"]["200"]["links"]
    for link in links.values():
        target = ids[link["operationId"]]
        names = {p["name"] for p in target["parameters"]}
        assert {key.removeprefix("path.") for key in link["parameters"]} <= names
        assert ("requestBody" in link) == ("requestBody" in target)


def test_the_receipt_form_described_is_the_one_issued_and_parsed() -> None:
    form = re.compile(RECEIPT_FORM[RECEIPT_FORM.index("^") :])
    issued = Signer("0123456789abcdef").issue(123456789012345678, "orders")
    assert form.fullmatch(issued)
    assert parse(issued).lease == 123456789012345678
    for text in ("", "a", issued + "x", issued.replace(".", ".0", 1), issued.upper()):
        assert not form.fullmatch(text)
        with pytest.raises(ReceiptError):
            parse(text)


def test_the_document_states_the_deployments_limits() -> None:
    schemas = DOCUMENT["components"]["schemas"]
    delay = schemas["ReleaseRequest"]["properties"]["delay_seconds"]["anyOf"][0]
    assert delay["maximum"] == 204.75
    receipts = schemas["AckBatchRequest"]["properties"]["receipts"]
    assert (receipts["minItems"], receipts["maxItems"]) == (1, routes.MAX_ACK_BATCH)
    # Without a topology the ladder is unknown: said in words only.
    bare = copy.deepcopy(openapi_document())
    PullExtension().document(bare)
    release = bare["components"]["schemas"]["ReleaseRequest"]["properties"]["delay_seconds"]
    assert "maximum" not in release["anyOf"][0]
    assert "longest delay" in release["description"]


class Accepting:
    """Receivers that take every request reaching them: what the edge let through."""

    settings = PULL

    async def receive(self, *args: Any) -> list[Any]:
        return []

    async def ack(self, queue: str, receipt: str) -> dict[str, Any]:
        return {}

    async def ack_all(self, queue: str, receipts: list[str]) -> list[None]:
        return [None for _ in receipts]

    async def release(self, queue: str, receipt: str, *args: Any) -> dict[str, Any]:
        return {"receipt": receipt, "outcome": "returned"}

    async def extend(self, queue: str, receipt: str, visibility: float) -> dict[str, Any]:
        return {"receipt": receipt, "visible_until": "2030-01-01T00:00:00.000Z"}


def edge_app() -> Starlette:
    app = create_app(SETTINGS, TOPOLOGY, pull=PULL)
    app.state.topology = TOPOLOGY
    app.state.receivers = Accepting()
    app.state.authenticator = Authenticator(())
    return app


APP = edge_app()
HANDLERS: dict[str, Callable[[Request], Awaitable[Response]]] = {
    "ReceiveRequest": routes.receive,
    "AckBatchRequest": routes.ack_batch,
    "ReleaseRequest": routes.release,
    "ExtendRequest": routes.extend,
}


def accepted_by_handler(schema: str, body: Any) -> bool:
    """Whether the route's handler takes `body` (sent as the JSON it is) from a consumer."""
    sent = [json.dumps(body).encode()]

    async def receive() -> dict[str, Any]:
        if sent:
            return {"type": "http.request", "body": sent.pop(), "more_body": False}
        await asyncio.Event().wait()  # as a server does: the client stays, and says nothing
        raise AssertionError("unreachable")

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
        "path_params": {"queue": "orders"},
        "app": APP,
        "state": {"principal": Principal("worker", frozenset({"consume:orders"}))},
    }

    async def status() -> int:
        try:
            response = await HANDLERS[schema](Request(scope, receive))
        except ApiError as error:
            return error.status
        return response.status_code

    answered = asyncio.run(status())
    assert answered in (200, 400, 413, 422)
    return answered == 200


def accepted_by_document(schema: str, body: Any) -> bool:
    root = {"$ref": f"#/components/schemas/{schema}", "components": DOCUMENT["components"]}
    return bool(jsonschema_rs.validator_for(root, validate_formats=True).is_valid(body))


# A fixed key, so that every pytest-xdist worker collects the same test ids.
R = Signer("0123456789abcdef", key=bytes(32)).issue(1, "orders")
RECEIVE_BODIES: list[Any] = [
    {},
    {"max_messages": 1, "wait_seconds": 0, "visibility_timeout": 0.001},
    {"max_messages": 10, "wait_seconds": 20, "visibility_timeout": 43_200},
    {"max_messages": 0},
    {"max_messages": 11},
    {"max_messages": 1.5},
    {"max_messages": True},
    {"max_messages": "1"},
    {"max_messages": None},
    {"max_messages": 2**64},
    {"wait_seconds": 0.25},
    {"wait_seconds": 20.001},
    {"wait_seconds": -0.1},
    {"wait_seconds": None},
    {"wait_seconds": "1"},
    {"visibility_timeout": 0},
    {"visibility_timeout": 43_200.5},
    {"visibility_timeout": None},
    {"visibility_timeout": False},
    {"other": 1},
    {"ack": [R]},
    {"ack": []},
    {"ack": None},
    {"ack": ["not one", ""]},  # each fails on its own, in the answer's `ack.failed`
    {"ack": [R] * routes.MAX_ACK_BATCH},
    {"ack": [R] * (routes.MAX_ACK_BATCH + 1)},
    {"ack": [1]},
    {"ack": R},
    {"max_messages": 10, "wait_seconds": 1, "ack": [R, R]},
    [],
    "receive",
]
ACK_BODIES: list[Any] = [
    {"receipts": [R]},
    {"receipts": ["not one", ""]},  # each fails on its own, in `failed`
    {"receipts": [R] * routes.MAX_ACK_BATCH},
    {"receipts": [R] * (routes.MAX_ACK_BATCH + 1)},
    {"receipts": []},
    {"receipts": [1]},
    {"receipts": [None]},
    {"receipts": R},
    {},
    {"receipts": [R], "other": 1},
    [R],
]
RELEASE_BODIES: list[Any] = [
    {"receipt": R},
    {"receipt": "r" * 64},
    {"receipt": "r" * 65},
    {"receipt": ""},
    {"receipt": 5},
    {},
    {"receipt": R, "delay_seconds": 0},
    {"receipt": R, "delay_seconds": 204.75},
    {"receipt": R, "delay_seconds": 204.76},
    {"receipt": R, "delay_seconds": -1},
    {"receipt": R, "delay_seconds": "5"},
    {"receipt": R, "delay_seconds": None},
    {"receipt": R, "dead_letter": True},
    {"receipt": R, "dead_letter": False, "delay_seconds": 3},
    {"receipt": R, "dead_letter": True, "delay_seconds": 3},
    {"receipt": R, "dead_letter": True, "delay_seconds": 0},
    {"receipt": R, "dead_letter": True, "delay_seconds": None},
    {"receipt": R, "dead_letter": 1},
    {"receipt": R, "dead_letter": None},
    {"receipt": R, "reason": "r" * 1000},
    {"receipt": R, "reason": "r" * 1001},
    {"receipt": R, "reason": None, "dead_letter": True},
    {"receipt": R, "other": 1},
]
EXTEND_BODIES: list[Any] = [
    {"receipt": R, "visibility_timeout": 0},
    {"receipt": R, "visibility_timeout": 43_200},
    {"receipt": R, "visibility_timeout": 43_200.01},
    {"receipt": R, "visibility_timeout": -1},
    {"receipt": R, "visibility_timeout": None},
    {"receipt": R, "visibility_timeout": "30"},
    {"receipt": R},
    {"visibility_timeout": 30},
    {"receipt": R, "visibility_timeout": 30, "other": 1},
]
CASES = [
    pytest.param(schema, body, id=f"{schema}:{json.dumps(body)[:60]}")
    for schema, bodies in (
        ("ReceiveRequest", RECEIVE_BODIES),
        ("AckBatchRequest", ACK_BODIES),
        ("ReleaseRequest", RELEASE_BODIES),
        ("ExtendRequest", EXTEND_BODIES),
    )
    for body in bodies
]


@pytest.mark.parametrize(("schema", "body"), CASES)
def test_a_body_is_valid_in_the_document_exactly_when_the_handler_takes_it(
    schema: str, body: Any
) -> None:
    assert accepted_by_document(schema, body) == accepted_by_handler(schema, body)


# JSON Schema calls 2.0 an integer where the handler sees a float (JSON does not tell). (A
# receipt's form is described, not a pattern: one of another form passes the edge and is
# answered 422 invalid_receipt by `parse`, checked above.)
KNOWN_DIFFERENCES: list[tuple[str, Any, bool, bool]] = [
    # schema, body, document says valid, handler takes it
    ("ReceiveRequest", {"max_messages": 2.0}, True, False),  # StrictInt
]


@pytest.mark.parametrize(("schema", "body", "in_document", "in_handler"), KNOWN_DIFFERENCES)
def test_what_json_schema_cannot_say_is_a_known_difference(
    schema: str, body: Any, in_document: bool, in_handler: bool
) -> None:
    assert (accepted_by_document(schema, body), accepted_by_handler(schema, body)) == (
        in_document,
        in_handler,
    )
