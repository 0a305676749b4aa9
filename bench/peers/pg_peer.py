"""PostgreSQL as the queue: "PostgreSQL SKIP LOCKED" (see `pg_worker` for the design, from
shared/seeds/004, and the worker).

It runs on the machine's PostgreSQL server (`BANDGATE_BENCH_POSTGRES`, by default
postgresql://postgres@127.0.0.1:5432/postgres), in a database of the bench's own,
`bandgate_bench_<random>`, created by `setup` and dropped by `tear_down` (also after a failure),
so the server is left as it was found. Before each run the rows of the last one (completed,
and hot jobs left pending) are deleted and the table vacuumed, as a queue's clean-up job would
keep it, and the backlog is brought back to its size with `COPY`. The server's CPU (every
backend's, other users' included) is reported as the broker's.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import orjson

from bench.environment import BenchBroker
from bench.peers.base import Peer, PeerConfig, Scenario

SERVER_ENV = "BANDGATE_BENCH_POSTGRES"
DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"


class PostgresPeer(Peer):
    name = "PostgreSQL SKIP LOCKED"
    needs = ("psycopg",)

    def __init__(self, broker: BenchBroker, scenario: Scenario) -> None:
        super().__init__(broker, scenario)
        self.database = f"bandgate_bench_{secrets.token_hex(4)}"
        self.created = False

    @property
    def server(self) -> str:
        return os.environ.get(SERVER_ENV, DEFAULT_SERVER)

    @property
    def url(self) -> str:
        from psycopg.conninfo import make_conninfo

        return str(make_conninfo(self.server, dbname=self.database))

    def config(self) -> PeerConfig:
        return PeerConfig(kind="pg", url=self.url, concurrency=self.scenario.concurrency)

    def setup(self) -> None:
        import psycopg

        from bench.peers import pg_worker

        with psycopg.connect(self.server, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {self.database}")
        self.created = True
        with psycopg.connect(self.url, autocommit=True) as connection:
            connection.execute(pg_worker.SCHEMA)

    def top_up(self) -> None:
        import psycopg

        from bench.peers import pg_worker

        row = orjson.dumps(self.scenario.payload).decode()
        with psycopg.connect(self.url, autocommit=True) as connection:
            connection.execute(
                "DELETE FROM priority_queue WHERE status <> 'pending' OR priority <> %s",
                (pg_worker.COLD,),
            )
            count_row = connection.execute(
                "SELECT count(*) FROM priority_queue WHERE queue_name = %s", (pg_worker.QUEUE,)
            ).fetchone()
            missing = self.scenario.backlog - (count_row[0] if count_row else 0)
            with connection.cursor() as cursor:
                copy_in = "COPY priority_queue (queue_name, payload, priority) FROM STDIN"
                with cursor.copy(copy_in) as copy:
                    for _ in range(missing):
                        copy.write_row((pg_worker.QUEUE, row, pg_worker.COLD))
            connection.execute("VACUUM ANALYZE priority_queue")

    def server_pid(self) -> int | None:
        """The postmaster's: the parent of this connection's backend (on this machine)."""
        import psycopg

        with psycopg.connect(self.url) as connection:
            stat = Path(f"/proc/{connection.info.backend_pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1])

    def tear_down(self) -> None:
        if not self.created:
            return
        import psycopg

        with psycopg.connect(self.server, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {self.database} WITH (FORCE)")
        self.created = False
