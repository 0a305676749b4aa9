"""`ConsumerApp`: the registry of handlers a worker runs, and the `@app.consumer` decorator.

The app owns its settings and topology but reads neither until it needs them: the first
`@app.consumer` loads the topology, because that is when options are checked (a typo fails at
import), and nothing connects before `run()`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from bandgate.consumers.consumer import DEFAULT_CONCURRENCY, Consumer, check_options
from bandgate.consumers.errors import ConfigurationError
from bandgate.consumers.scheduling import PolicyName
from bandgate.consumers.settings import WorkerSettings
from bandgate.topology.model import Topology

HandlerT = TypeVar("HandlerT", bound=Callable[..., Any])


class ConsumerApp:
    """Handlers for bandgate queues; `bandgate worker module:app` runs them.

    Settings come from `BANDGATE_*` (read on first use) unless given; the topology from the
    settings' topology file unless given.
    """

    def __init__(
        self, settings: WorkerSettings | None = None, *, topology: Topology | None = None
    ) -> None:
        self._settings = settings
        self._topology = topology
        self._consumers: dict[str, Consumer] = {}

    @property
    def settings(self) -> WorkerSettings:
        """The worker's settings: those given, else read from `BANDGATE_*` on first use."""
        if self._settings is None:
            self._settings = WorkerSettings()
        return self._settings

    @property
    def topology(self) -> Topology:
        """The topology given, else the file `settings.topology` names, read on first use."""
        if self._topology is None:
            self._topology = self.settings.load_topology()
        return self._topology

    @property
    def consumers(self) -> tuple[Consumer, ...]:
        """Every consumer the app's decorators registered, in the order they ran."""
        return tuple(self._consumers.values())

    def consumer_for(self, queue: str) -> Consumer:
        """The consumer registered for `queue` (ConfigurationError, naming those there are,
        when none is)."""
        try:
            return self._consumers[queue]
        except KeyError:
            known = ", ".join(self._consumers) or "none"
            raise ConfigurationError(
                f"this app has no consumer for queue {queue!r} (consumers: {known})"
            ) from None

    def consumer(
        self,
        queue: str,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        policy: PolicyName = "strict",
        time_limit: float | None = None,
        max_attempts: int | None = None,
        max_deliveries: int | None = None,
        prefetch: Mapping[str, int] | None = None,
        dedupe: bool = False,
        hot_reserve: int = 0,
    ) -> Callable[[HandlerT], HandlerT]:
        """Register the decorated function as the handler of `queue`; it is returned unchanged.

        - `concurrency`: handlers running at once (async tasks, or threads for a sync handler).
        - `policy`: `strict` waterfall, or `weighted` shares per band (the topology's weights).
        - `time_limit`: seconds; a handler past it is cancelled and the attempt failed.
        - `max_attempts`, `max_deliveries`: override the queue's retry policy.
        - `prefetch`: per band name, overrides `bandgate.consumers.scheduling.default_prefetch`;
          a sharded band's is split over its shards.
        - `dedupe`: run a message id once within the ledger's retention window: a copy
          published again with the same id (after a `confirm_timeout`, say) is skipped. Each
          handled message is recorded in the ledger first, which costs a confirmed publish.
        - `hot_reserve`: slots the coldest band never takes, kept for hotter bands even after
          a quiet spell, so the first hot message after one starts at once instead of waiting
          for a cold handler to end (`bandgate.consumers.scheduling`, "Headroom"); cold work
          then runs on `concurrency - hot_reserve` slots at most.

        On an ordered queue, a partition key's messages run one at a time in order and failures
        are retried in place (`bandgate.consumers.decision`); a strictly serial one runs one
        message at a time, whatever `concurrency` says.
        """
        spec, options = check_options(
            self.topology,
            queue,
            concurrency=concurrency,
            policy=policy,
            time_limit=time_limit,
            max_attempts=max_attempts,
            max_deliveries=max_deliveries,
            prefetch=prefetch,
            dedupe=dedupe,
            hot_reserve=hot_reserve,
        )

        def register(handler: HandlerT) -> HandlerT:
            if not callable(handler):
                raise ConfigurationError(f"@consumer({queue!r}) must decorate a function")
            existing = self._consumers.get(queue)
            if existing is not None:
                raise ConfigurationError(
                    f"@consumer({queue!r}): queue {queue!r} already has a handler, "
                    f"{existing.name}; one handler per queue and app"
                )
            self._consumers[queue] = Consumer(handler, spec, options)
            return handler

        return register

    def run(self, *, concurrency: int | None = None) -> None:
        """Run a worker for every consumer until SIGTERM or SIGINT (blocks)."""
        # The worker needs aio-pika's runtime; import late. (The worker does not import
        # this module: it takes any `bandgate.consumers.consumer.Registry`.)
        from bandgate.consumers.worker import Worker, run_until_stopped

        run_until_stopped(Worker(self, concurrency=concurrency))
