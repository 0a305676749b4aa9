"""The topology as a RabbitMQ definitions file (`definitions.json`).

The broker loads it at boot (`load_definitions` in rabbitmq.conf, as docker-compose does), or
an operator imports it into a running broker (`POST /api/definitions/{vhost}`). It is built
only from `objects.plan()`, the same plan the declarer applies, so the file and `bandgate
topology apply` cannot disagree. Lists are sorted by name and keys are sorted when rendered,
so the committed file changes only where the topology does.

Users: a node that loads definitions at boot does not create its default user ("Will not seed
default virtual host and user: have definitions to load"), so a boot file without users leaves
a broker nobody can log in to. A file imported into a running broker, on the other hand, must
not carry a login: it would create or reset that user wherever it is imported. So users are
opt-in: `dev_user=True` adds one well-known development login (not `guest`, which RabbitMQ
only admits from localhost, so containers could not use it) for the docker-compose broker.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Literal, TypedDict

from bandgate.topology.model import Topology
from bandgate.topology.objects import ExchangeType, QueueArguments, plan

DEV_USER = "bandgate"
DEV_PASSWORD = "bandgate"  # for the local docker-compose broker only, like guest/guest
# A fixed salt keeps the export byte-for-byte reproducible; the password is public anyway.
_DEV_SALT = b"bgdv"


class VhostDefinition(TypedDict):
    name: str


class UserDefinition(TypedDict):
    name: str
    password_hash: str
    hashing_algorithm: str
    tags: str


class PermissionDefinition(TypedDict):
    user: str
    vhost: str
    configure: str
    write: str
    read: str


class ExchangeDefinition(TypedDict):
    name: str
    vhost: str
    type: ExchangeType
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: dict[str, object]


class QueueDefinition(TypedDict):
    name: str
    vhost: str
    durable: bool
    auto_delete: bool
    arguments: QueueArguments


class BindingDefinition(TypedDict):
    source: str
    vhost: str
    destination: str
    destination_type: Literal["queue", "exchange"]
    routing_key: str
    arguments: dict[str, object]


class Definitions(TypedDict):
    vhosts: list[VhostDefinition]
    users: list[UserDefinition]
    permissions: list[PermissionDefinition]
    topic_permissions: list[object]
    parameters: list[object]
    global_parameters: list[object]
    policies: list[object]
    exchanges: list[ExchangeDefinition]
    queues: list[QueueDefinition]
    bindings: list[BindingDefinition]


def password_hash(password: str, salt: bytes) -> str:
    """A password as RabbitMQ's `rabbit_password_hashing_sha256` stores it."""
    digest = hashlib.sha256(salt + password.encode()).digest()
    return base64.b64encode(salt + digest).decode()


def definitions(topology: Topology, vhost: str = "/", *, dev_user: bool = False) -> Definitions:
    """Every exchange, queue and binding of `topology` in `vhost`, as definitions.json."""
    objects = plan(topology)
    exchanges = [
        ExchangeDefinition(
            name=exchange.name,
            vhost=vhost,
            type=exchange.type,
            durable=True,
            auto_delete=False,
            internal=False,
            arguments=dict(exchange.arguments),
        )
        for exchange in objects.exchanges
    ]
    queues = [
        QueueDefinition(
            name=queue.name,
            vhost=vhost,
            durable=True,
            auto_delete=False,
            arguments=QueueArguments(**queue.arguments),
        )
        for queue in objects.queues
    ]
    bindings = [
        BindingDefinition(
            source=binding.source,
            vhost=vhost,
            destination=binding.destination,
            destination_type=binding.destination_type,
            routing_key=binding.routing_key,
            arguments={},
        )
        for binding in objects.bindings
    ]
    users: list[UserDefinition] = []
    permissions: list[PermissionDefinition] = []
    if dev_user:
        users.append(
            UserDefinition(
                name=DEV_USER,
                password_hash=password_hash(DEV_PASSWORD, _DEV_SALT),
                hashing_algorithm="rabbit_password_hashing_sha256",
                tags="administrator",
            )
        )
        permissions.append(
            PermissionDefinition(user=DEV_USER, vhost=vhost, configure=".*", write=".*", read=".*")
        )
    return Definitions(
        vhosts=[VhostDefinition(name=vhost)],
        users=users,
        permissions=permissions,
        topic_permissions=[],
        parameters=[],
        global_parameters=[],
        policies=[],
        exchanges=sorted(exchanges, key=lambda e: e["name"]),
        queues=sorted(queues, key=lambda q: q["name"]),
        bindings=sorted(
            bindings,
            key=lambda b: (b["source"], b["destination_type"], b["destination"], b["routing_key"]),
        ),
    )


def to_json(document: Definitions) -> str:
    """The file's text: sorted keys, two-space indent, one trailing newline."""
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


__all__ = [
    "DEV_PASSWORD",
    "DEV_USER",
    "Definitions",
    "definitions",
    "password_hash",
    "to_json",
]
