"""The Python producer: publish from a program with the gateway's guarantees, without HTTP.

A `Published` means what the gateway's 201 means: the broker confirmed the message (persistent,
mandatory, routed to its band or the delay ladder). Input goes through the rules the gateway
applies (`topology.publish_input`) and the publish through the same `Publisher`, so a message
published here carries the same properties and headers, and every failure is the same
`PublishFailure` with the same code.

The producer refuses what the gateway refuses, before anything is sent: a payload or header
that no JSON body can hold (`NotJson`, the gateway's `malformed_json`; RabbitMQ would close the
whole connection on a NaN header) and a payload over the gateway's body limit
(`PayloadTooLarge`, its `body_too_large`). The limit is `max_body_bytes`: by default
`BANDGATE_MAX_BODY_BYTES` as the gateway reads it, else the gateway's default (256 KiB). The
producer counts the payload's compact JSON; the gateway counts the whole HTTP body, a few bytes
more.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Required, TypedDict, Unpack

from aio_pika.abc import AbstractRobustConnection
from pydantic import Field

from bandgate.core import cluster_connection, error_codes, tombstoning
from bandgate.core.broker import RECONNECT_INTERVAL_SECONDS, is_blocked
from bandgate.core.ledger import Entry
from bandgate.core.protocol.confirms import ChannelSet, confirm_channel_factory
from bandgate.core.publish_outcomes import (
    BrokerBlocked,
    BrokerUnavailable,
    InvalidMessage,
    Published,
    PublishFailure,
    UnknownQueue,
)
from bandgate.core.publishing import PublishChannels, Publisher
from bandgate.core.telemetry import Telemetry
from bandgate.topology import naming
from bandgate.topology.declare import apply_topology
from bandgate.topology.loader import load_topology
from bandgate.topology.model import QueueSpec, Topology, UnknownQueueError
from bandgate.topology.publish_input import (
    MAX_BODY_BYTES,
    InputRule,
    MessageInputError,
    envelope_for,
    payload_body,
)
from bandgate.topology.settings import BrokerSettings, redact
from bandgate.topology.wire import Envelope, HeaderValue

# The Python name of an HTTP body's field, where they differ.
_PYTHON_FIELDS = {"delay_seconds": "delay"}


class NotJson(InvalidMessage):
    """A payload or header value no JSON body can hold (NaN, +-inf, a datetime, a tuple, a
    lone surrogate): the gateway refuses such a body as `malformed_json`."""

    error = error_codes.MALFORMED_JSON


class PayloadTooLarge(InvalidMessage):
    """The payload's JSON is over the gateway's body limit (`max_body_bytes`)."""

    error = error_codes.BODY_TOO_LARGE


_RULE_FAILURES: dict[InputRule, type[InvalidMessage]] = {
    InputRule.NOT_JSON: NotJson,
    InputRule.TOO_LARGE: PayloadTooLarge,
}


class ProducerSettings(BrokerSettings):
    """The broker, and the body limit the gateway applies (`BANDGATE_MAX_BODY_BYTES`)."""

    max_body_bytes: int = Field(
        default=MAX_BODY_BYTES,
        gt=0,
        description="a payload whose JSON is larger is refused (body_too_large), as the gateway "
        "refuses such a body",
    )


class PublishOptions(TypedDict, total=False):
    """The keyword arguments of `publish` but `message_id` (those of `replace`)."""

    priority: int | str | None
    delay: float | None
    deliver_at: datetime | None
    headers: Mapping[str, HeaderValue] | None
    partition_key: str | None
    tenant: str | None


class BatchMessage(PublishOptions, total=False):
    """One message of `publish_batch`: a payload and the keyword arguments of `publish`."""

    payload: Required[Any]
    message_id: str | None


_BATCH_KEYS = BatchMessage.__required_keys__ | BatchMessage.__optional_keys__


@dataclass(frozen=True)
class BatchResult:
    """One outcome per message of a batch, in the batch's order."""

    outcomes: tuple[Published | PublishFailure, ...]

    @property
    def successful(self) -> list[tuple[int, Published]]:
        """(index, result) of every message the broker confirmed."""
        return [(i, o) for i, o in enumerate(self.outcomes) if isinstance(o, Published)]

    @property
    def failed(self) -> list[tuple[int, PublishFailure]]:
        """(index, failure) of every other message; each failure says if it may be enqueued."""
        return [(i, o) for i, o in enumerate(self.outcomes) if isinstance(o, PublishFailure)]


class Producer:
    """Publishes to the topology's queues over one robust connection and a few confirm
    channels. Use it from one event loop; `SyncProducer` serves code without one."""

    def __init__(
        self,
        connection: AbstractRobustConnection,
        topology: Topology,
        *,
        confirm_timeout: float = 5.0,
        channel_pool_size: int = 2,
        telemetry: Telemetry | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        channels: PublishChannels | None = None,
    ) -> None:
        """A producer on a connection the caller owns (`close` leaves it open); `connect`
        opens one of its own. A payload over `max_body_bytes` of JSON is refused, as the
        gateway refuses a body over its `BANDGATE_MAX_BODY_BYTES`. `channels`: publish
        through these instead of confirm channels of `connection` (the in-memory broker of
        `bandgate.testing`)."""
        self.connection = connection
        self.topology = topology
        self.max_body_bytes = max_body_bytes
        self._channels = channels or ChannelSet(
            confirm_channel_factory(connection), channel_pool_size
        )
        self._publisher = Publisher(topology, self._channels, confirm_timeout, telemetry)
        self._owns_connection = False
        self._closed = False
        self._running = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @classmethod
    def connect(
        cls,
        url: str | None = None,
        *,
        topology: Topology | str | os.PathLike[str] | None = None,
        confirm_timeout: float = 5.0,
        declare_topology: bool = False,
        channel_pool_size: int = 2,
        connect_timeout: float = 10.0,
        connection_name: str = naming.PRODUCER_CONNECTION,
        telemetry: Telemetry | None = None,
        max_body_bytes: int | None = None,
    ) -> Connecting:
        """Connect to the broker at `url`: `await` it, or `async with` it to close on exit.

        Without `url`, the broker is the one the gateway and the workers would pick:
        `BANDGATE_AMQP_URL`, else the one `bandgate dev` (`make run`) recorded here, else the
        default local address (`BrokerSettings`).

        The topology is the file `BANDGATE_TOPOLOGY` names (default ./bandgate.toml), as for
        the gateway and the workers, unless given as a `Topology` or a path. The producer
        declares nothing unless `declare_topology` (its user may only be allowed to write);
        without the topology on the broker a publish raises `Unroutable` or `TopologyMissing`.
        A broker that cannot be reached raises `BrokerUnavailable`.

        A payload is refused over `max_body_bytes` of JSON: by default the gateway's limit,
        `BANDGATE_MAX_BODY_BYTES` when set, else 256 KiB.
        """

        settings = ProducerSettings(amqp_url=url) if url else ProducerSettings()
        body_limit = max_body_bytes or settings.max_body_bytes
        where = settings.describe_broker() if url is None else redact(url)

        async def open_producer() -> Producer:
            model = topology if isinstance(topology, Topology) else load_topology(topology)
            try:
                connection = await cluster_connection.connect_robust(
                    settings.amqp_url,
                    client_properties={"connection_name": connection_name},
                    connect_timeout=connect_timeout,
                    reconnect_interval=RECONNECT_INTERVAL_SECONDS,
                )
            except cluster_connection.CONNECT_ERRORS as exc:
                raise BrokerUnavailable(f"cannot connect to RabbitMQ at {where}: {exc!r}") from None
            try:
                if declare_topology:
                    await apply_topology(connection, model)
                producer = cls(
                    connection,
                    model,
                    confirm_timeout=confirm_timeout,
                    channel_pool_size=channel_pool_size,
                    telemetry=telemetry,
                    max_body_bytes=body_limit,
                )
            except BaseException:
                await connection.close()
                raise
            producer._owns_connection = True
            return producer

        return Connecting(open_producer)

    async def publish(
        self,
        queue: str,
        payload: Any,
        *,
        priority: int | str | None = None,
        delay: float | None = None,
        deliver_at: datetime | None = None,
        headers: Mapping[str, HeaderValue] | None = None,
        message_id: str | None = None,
        partition_key: str | None = None,
        tenant: str | None = None,
    ) -> Published:
        """Publish one message and wait for the broker's confirm, as `POST .../messages` does.

        `priority` is 0-9 or an alias (critical=9, high=7, normal=4, low=2, background=0;
        default 4); `delay` (seconds) or `deliver_at` (a datetime with a time zone) hold it
        back; `tenant` names whose message it is (a fair band keeps a flooding tenant out of
        the others' way). Raises `InvalidMessage` (`UnknownQueue`, ...) before anything is
        sent, another `NotEnqueued` when it is certainly not in a queue, `OutcomeUnknown` when
        it may be.
        """
        envelope = self._envelope(
            self._spec(queue),
            payload,
            {
                "priority": priority,
                "delay": delay,
                "deliver_at": deliver_at,
                "headers": headers,
                "message_id": message_id,
                "partition_key": partition_key,
                "tenant": tenant,
            },
        )
        self._begin()
        try:
            return await self._publisher.publish(envelope)
        finally:
            self._end()

    async def publish_batch(self, queue: str, messages: Iterable[BatchMessage]) -> BatchResult:
        """Publish many messages to `queue` at once (confirms pipelined), as the gateway's
        batch endpoint does: every message is checked and encoded before any is sent, and one
        that fails, fails alone. An unknown queue raises `UnknownQueue` for the whole batch."""
        spec = self._spec(queue)
        outcomes: list[Published | PublishFailure | None] = []
        valid: list[tuple[int, Envelope]] = []
        for index, message in enumerate(messages):
            try:
                valid.append((index, self._batch_envelope(spec, message)))
                outcomes.append(None)
            except InvalidMessage as invalid:
                outcomes.append(invalid)
        if valid:
            self._begin()
            try:
                results = await self._publisher.publish_many([envelope for _, envelope in valid])
            finally:
                self._end()
            for (index, _), result in zip(valid, results, strict=True):
                outcomes[index] = result
        settled = tuple(outcome for outcome in outcomes if outcome is not None)
        assert len(settled) == len(outcomes), "a batch message was never settled"
        return BatchResult(settled)

    async def cancel(self, queue: str, message_id: str) -> Entry:
        """Cancel every copy of `message_id` published to `queue` before now that no consumer
        has started, as `DELETE .../messages/{message_id}` does: a tombstone in the ledger,
        which consumers that follow it read before they run a copy. The ledger cannot tell an
        id never published, or already handled, from a pending one."""
        spec = self._spec(queue)
        # The id follows the rule a published one does, as the gateway's path id does.
        self._envelope(spec, None, {"message_id": message_id})
        self._begin()
        try:
            return await tombstoning.cancel(self._publisher, spec.name, message_id)
        finally:
            self._end()

    async def replace(
        self, queue: str, message_id: str, payload: Any, **options: Unpack[PublishOptions]
    ) -> tuple[Published, int]:
        """Publish `payload` as a new generation of `message_id` (with `publish`'s options)
        and cancel the older copies, as `PUT .../messages/{message_id}` does: (what was
        published, its generation). An escalate is a replace at a hotter `priority`.
        `tombstoning.TombstoneNotWritten` when the new copy was confirmed and its tombstone
        was not (the older copies may run)."""
        envelope = self._envelope(self._spec(queue), payload, {**options, "message_id": message_id})
        self._begin()
        try:
            return await tombstoning.publish_generation(self._publisher, envelope)
        finally:
            self._end()

    async def close(self) -> None:
        """Refuse new publishes, wait for those under way (each ends within the confirm
        timeout), then close the channels and the connection `connect` opened."""
        if self._closed:
            return
        self._closed = True
        await self._idle.wait()
        # A connection that is already gone fails the close of its channels: nothing to undo.
        with contextlib.suppress(Exception):
            await self._channels.close()
        if self._owns_connection:
            await self.connection.close()

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _spec(self, queue: str) -> QueueSpec:
        try:
            return self.topology.queue(queue)
        except UnknownQueueError as exc:
            raise UnknownQueue(str(exc), "queue") from None

    def _envelope(self, spec: QueueSpec, payload: Any, options: Mapping[str, Any]) -> Envelope:
        """The gateway's rules applied to a Python call; a broken rule is `InvalidMessage`."""
        try:
            envelope = envelope_for(
                self.topology,
                spec,
                payload,
                priority=options.get("priority"),
                delay_seconds=options.get("delay"),
                deliver_at=options.get("deliver_at"),
                headers=options.get("headers"),
                message_id=options.get("message_id"),
                partition_key=options.get("partition_key"),
                tenant=options.get("tenant"),
            )
            payload_body(payload, self.max_body_bytes)
        except MessageInputError as exc:
            field = _PYTHON_FIELDS.get(exc.field, exc.field)
            failure = _RULE_FAILURES.get(exc.rule, InvalidMessage)
            raise failure(str(exc), field, error_codes.for_rule(exc.rule)) from None
        return envelope

    def _batch_envelope(self, spec: QueueSpec, message: object) -> Envelope:
        if not isinstance(message, Mapping):
            raise InvalidMessage(
                "a batch message must be a mapping", None, error_codes.INVALID_BODY
            )
        unknown = sorted(str(key) for key in message if key not in _BATCH_KEYS)
        if unknown:
            raise InvalidMessage(
                f"{unknown[0]} is not a known field", unknown[0], error_codes.UNKNOWN_FIELD
            )
        if "payload" not in message:
            raise InvalidMessage("payload is required", "payload", error_codes.MISSING_FIELD)
        return self._envelope(spec, message["payload"], message)

    def _begin(self) -> None:
        """Count a publish under way, or refuse it at once: the producer is closed, or the
        broker blocks publishing (which would hold it for the whole confirm timeout)."""
        if self._closed:
            raise BrokerUnavailable("the producer is closed")
        if is_blocked(self.connection):
            raise BrokerBlocked()
        self._running += 1
        self._idle.clear()

    def _end(self) -> None:
        self._running -= 1
        if not self._running:
            self._idle.set()


class Connecting:
    """What `Producer.connect` returns: `await` it for an open producer, or use it with
    `async with`, which closes the producer on the way out."""

    def __init__(self, opening: Callable[[], Awaitable[Producer]]) -> None:
        self._opening = opening
        self._producer: Producer | None = None

    def __await__(self) -> Generator[Any, None, Producer]:
        return self._opening().__await__()

    async def __aenter__(self) -> Producer:
        self._producer = await self._opening()
        return self._producer

    async def __aexit__(self, *exc_info: object) -> None:
        if self._producer is not None:
            await self._producer.close()
