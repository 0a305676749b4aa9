"""The gateway's link to RabbitMQ: one robust connection, a set of confirm channels, and
readiness.

The gateway starts and serves even while the broker is away: the link connects in the
background, (re)applies the topology on every (re)connect, and answers 503 meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiormq
from aio_pika.abc import AbstractChannel, AbstractRobustConnection

from bandgate.core import cluster_connection
from bandgate.core.protocol import compat
from bandgate.core.publishing import BrokerUnavailable, ChannelSet, PublishChannels, Publisher
from bandgate.core.telemetry import Telemetry
from bandgate.topology import naming
from bandgate.topology.declare import TopologyConflictError, apply_topology, broker_version
from bandgate.topology.doctor import check_broker, log_report
from bandgate.topology.loader import TopologyError
from bandgate.topology.management import ManagementClient, vhost_of
from bandgate.topology.model import Topology
from bandgate.topology.settings import redact

compat.check_amqp()  # is_blocked reads aiormq's connection internals

log = logging.getLogger(__name__)

# aio-pika waits 5 s between reconnect attempts by default; a gateway should be back
# within about a second of the broker.
RECONNECT_INTERVAL_SECONDS = 1.0


def is_blocked(connection: AbstractRobustConnection | None) -> bool:
    """True while the broker blocks publishing on `connection` (a memory or disk alarm).

    aiormq tracks Connection.Blocked/Unblocked but keeps it private; a publish on a blocked
    connection waits for the whole confirm timeout, so publishers check first and refuse at
    once. `core.protocol.compat` holds aiormq to the releases that have the attribute, and
    tests/unit/test_protocol_compat.py reads it on a real aiormq connection.
    """
    transport = connection.transport if connection else None
    if transport is None:
        return False
    return not compat.unblocked_event(transport.connection).is_set()


class BrokerLink:
    def __init__(
        self,
        amqp_url: str,
        topology: Topology,
        *,
        connection_name: str = naming.GATEWAY_CONNECTION,
        channel_pool_size: int = 1,
        confirm_timeout: float = 5.0,
        declare_topology: bool = True,
        management_url: str | None = None,
        telemetry: Telemetry | None = None,
        where: str | None = None,
        channels: PublishChannels | None = None,
    ) -> None:
        """`channels`: publish through these instead of confirm channels of the connection
        (the in-memory broker of `bandgate.testing`)."""
        self.amqp_url = amqp_url
        # How errors name the broker: the URL without its password and the setting that chose it.
        self.where = where or redact(amqp_url)
        self.topology = topology
        self.connection_name = connection_name
        self.declare_topology = declare_topology
        self.management_url = management_url
        self.management = (
            ManagementClient(management_url, vhost_of(amqp_url)) if management_url else None
        )
        self.connection: AbstractRobustConnection | None = None
        self.channels = channels or ChannelSet(self._open_confirm_channel, channel_pool_size)
        self.publisher = Publisher(topology, self.channels, confirm_timeout, telemetry)
        self.problem: str | None = "not connected yet"
        self._task: asyncio.Task[None] | None = None

    @property
    def connected(self) -> bool:
        connection = self.connection
        return connection is not None and not connection.is_closed and connection.connected.is_set()

    @property
    def blocked(self) -> bool:
        """True while the broker blocks publishing (a memory or disk alarm)."""
        return is_blocked(self.connection)

    @property
    def version(self) -> str:
        return broker_version(self.connection) if self.connection else "unknown"

    async def start(self, wait: float = 0.0) -> None:
        """Start connecting in the background; wait up to `wait` s for the first connection.

        A topology conflict is fatal and raised from here: serving would lose messages.
        """
        self._task = asyncio.create_task(self._connect_forever(), name="bandgate-broker-link")
        if wait > 0:
            done, _ = await asyncio.wait({self._task}, timeout=wait)
            if done:
                self._task.result()

    async def _connect_forever(self) -> None:
        delay = 0.5
        while self.connection is None:
            try:
                connection = await cluster_connection.connect_robust(
                    self.amqp_url,
                    client_properties={"connection_name": self.connection_name},
                    connect_timeout=10,
                    reconnect_interval=RECONNECT_INTERVAL_SECONDS,
                )
            except cluster_connection.CONNECT_ERRORS as exc:
                self.problem = f"cannot connect to the broker at {self.where}: {exc}"
                log.warning("%s; retrying in %.1f s", self.problem, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            try:
                await self._prepare(connection)
            except TopologyError as exc:
                self.problem = str(exc)
                await connection.close()
                raise
            except (aiormq.exceptions.AMQPError, ConnectionError, OSError) as exc:
                self.problem = f"broker check failed: {exc}"
                log.warning("%s; retrying in %.1f s", self.problem, delay)
                await connection.close()
                await asyncio.sleep(delay)
                continue
            connection.reconnect_callbacks.add(self._on_reconnect)
            self.connection = connection
            self.problem = None
            log.info("connected to RabbitMQ %s", self.version)

    async def _prepare(self, connection: AbstractRobustConnection) -> None:
        """Check the broker (version, in-band order, conflicts, dangerous policies), refuse a
        configuration that would lose or loop messages, then apply the topology."""
        report = await check_broker(
            connection, self.topology, self.management_url, vhost_of(self.amqp_url)
        )
        log_report(report)
        report.raise_for_errors()
        if self.declare_topology:
            await apply_topology(connection, self.topology, self.management)

    async def _on_reconnect(self, connection: AbstractRobustConnection | None) -> None:
        log.info("reconnected to the broker")
        if connection is None:
            return
        try:
            await self._prepare(connection)
        except TopologyConflictError:
            log.exception("topology conflict after reconnect")
        except Exception:  # a failed re-declare must not kill the reconnect loop
            log.exception("re-applying the topology after reconnect failed")

    async def _open_confirm_channel(self) -> AbstractChannel:
        if self.connection is None or not self.connected:
            raise BrokerUnavailable(self.problem or "the broker is unavailable")
        return await self.connection.channel(publisher_confirms=True, on_return_raises=True)

    async def check_ready(self) -> str | None:
        """None when the broker is connected and the topology present, else the reason."""
        if self.connection is None or not self.connected:
            return self.problem or "not connected to the broker"
        if self.blocked:
            return "the broker blocks publishing (memory or disk alarm)"
        try:
            channel = await self.connection.channel(publisher_confirms=False)
        except (aiormq.exceptions.AMQPError, ConnectionError, RuntimeError) as exc:
            return f"cannot open a channel: {exc}"
        try:
            await channel.get_exchange(self.topology.exchange, ensure=True)
            for spec in self.topology.queues.values():
                for band in spec.bands:
                    for name in spec.band_queues(band):
                        await channel.get_queue(name, ensure=True)
        except aiormq.exceptions.ChannelNotFoundEntity as exc:
            return f"topology missing on the broker ({exc}): run `bandgate topology apply`"
        except (aiormq.exceptions.AMQPError, ConnectionError, RuntimeError) as exc:
            return f"broker check failed: {exc}"
        finally:
            if not channel.is_closed:
                with contextlib.suppress(Exception):
                    await channel.close()
        return None

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        with contextlib.suppress(Exception):
            await self.channels.close()
        if self.connection is not None:
            await self.connection.close()
            self.connection = None
