"""The OpenAPI document, built from the same pydantic models that validate requests."""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from gateway.schemas import (
    BatchRequest,
    BatchResponse,
    ErrorResponse,
    PublishedMessage,
    PublishRequest,
)

_MODELS: tuple[type[BaseModel], ...] = (
    PublishRequest,
    BatchRequest,
    PublishedMessage,
    BatchResponse,
    ErrorResponse,
)


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _json(model: type[BaseModel]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": _ref(model)}}}


def _errors(*statuses: int) -> dict[str, Any]:
    return {str(status): {"description": "error", **_json(ErrorResponse)} for status in statuses}


_QUEUE = {"name": "queue", "in": "path", "required": True, "schema": {"type": "string"}}


@cache
def openapi_document() -> dict[str, Any]:
    _, schemas = models_json_schema(
        [(model, "validation") for model in _MODELS], ref_template="#/components/schemas/{model}"
    )
    publish_errors = _errors(400, 404, 413, 415, 422, 503)
    return {
        "openapi": "3.1.0",
        "info": {"title": "bandgate", "version": "1"},
        "paths": {
            "/v1/queues/{queue}/messages": {
                "post": {
                    "summary": "Publish one message; 201 once the broker confirmed it",
                    "parameters": [_QUEUE],
                    "requestBody": {"required": True, **_json(PublishRequest)},
                    "responses": {
                        "201": {"description": "confirmed", **_json(PublishedMessage)},
                        **publish_errors,
                    },
                }
            },
            "/v1/queues/{queue}/messages/batch": {
                "post": {
                    "summary": "Publish up to the batch limit; a result per message",
                    "parameters": [_QUEUE],
                    "requestBody": {"required": True, **_json(BatchRequest)},
                    "responses": {
                        "200": {"description": "per-message results", **_json(BatchResponse)},
                        **publish_errors,
                    },
                }
            },
            "/v1/queues": {
                "get": {
                    "summary": "Queues with their bands",
                    "responses": {"200": {"description": "queues"}},
                }
            },
            "/v1/queues/{queue}/stats": {
                "get": {
                    "summary": "Per band ready, unacked and consumers; delayed and dead letters",
                    "parameters": [_QUEUE],
                    "responses": {"200": {"description": "stats"}, **_errors(404, 503)},
                }
            },
            "/healthz": {"get": {"responses": {"200": {"description": "process alive"}}}},
            "/readyz": {
                "get": {
                    "responses": {
                        "200": {"description": "broker connected, topology present"},
                        **_errors(503),
                    }
                }
            },
        },
        "components": {"schemas": schemas.get("$defs", {})},
    }
