"""A PostgreSQL queue as shared/seeds/004 designs it ("PostgreSQL SKIP LOCKED Dispatch"): its
table, the worker that polls it, and the client that enqueues. Needs the `bench` extra.

The table is the seed's `priority_queue` (0 is CRITICAL, 4 BACKGROUND: lower is more urgent),
indexed on (queue_name, status, priority, enqueued_at), as a user indexes what the claim
filters and orders by (the seed's own index is a partial one on (queue_name, priority,
enqueued_at) WHERE status = 'pending'). The worker is `concurrency` threads, each with a
connection of its own, each looping the seed's `dequeue`: one statement,

    WITH claimed AS (SELECT id ... ORDER BY priority ASC, enqueued_at ASC LIMIT 1
                     FOR UPDATE SKIP LOCKED)
    UPDATE priority_queue ... SET status = 'processing' ... RETURNING ...

then the handler, then `status = 'completed'`. Each statement commits on its own (autocommit:
the seed commits after each). When a claim finds nothing the thread sleeps `POLL_SECONDS`
(the seed names no interval, only "the next worker poll cycle"). Enqueueing is the seed's
`enqueue`: one `INSERT`, committed.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from bench.peers.base import LockedRecorder, PeerConfig, say

POLL_SECONDS = 0.05
QUEUE = "orders"
HOT, COLD = 0, 3  # CRITICAL and LOW

SCHEMA = """
CREATE TABLE priority_queue (
    id           BIGSERIAL PRIMARY KEY,
    queue_name   VARCHAR(100) NOT NULL,
    payload      JSONB NOT NULL,
    priority     SMALLINT NOT NULL DEFAULT 2 CHECK (priority BETWEEN 0 AND 4),
    status       VARCHAR(20) NOT NULL DEFAULT 'pending',
    attempts     INT NOT NULL DEFAULT 0,
    max_attempts INT NOT NULL DEFAULT 3,
    scheduled_at TIMESTAMPTZ NOT NULL DEFAULT NOW(),
    locked_until TIMESTAMPTZ,
    enqueued_at  TIMESTAMPTZ NOT NULL DEFAULT NOW(),
    escalated_at TIMESTAMPTZ,
    escalated_by VARCHAR(100)
);
CREATE INDEX ON priority_queue (queue_name, status, priority, enqueued_at);
CREATE INDEX ON priority_queue (locked_until) WHERE status = 'processing';
"""

CLAIM = """
WITH claimed AS (
    SELECT id FROM priority_queue
    WHERE queue_name = %s
      AND status = 'pending'
      AND scheduled_at <= NOW()
      AND (locked_until IS NULL OR locked_until < NOW())
    ORDER BY priority ASC, enqueued_at ASC
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE priority_queue pq
SET status = 'processing',
    locked_until = NOW() + INTERVAL '5 minutes',
    attempts = attempts + 1
FROM claimed
WHERE pq.id = claimed.id
RETURNING pq.id, pq.payload, pq.priority, pq.attempts
"""

DONE = "UPDATE priority_queue SET status = 'completed', locked_until = NULL WHERE id = %s"
ENQUEUE = "INSERT INTO priority_queue (queue_name, payload, priority) VALUES (%s, %s, %s)"


def _work(
    config: PeerConfig,
    recorder: LockedRecorder,
    connected: threading.Barrier,
    stop: threading.Event,
) -> None:
    """One worker thread: claim, handle, complete, until `stop`; a handler in hand finishes."""
    pause = config.handler_ms / 1000
    with psycopg.connect(config.url, autocommit=True) as connection:
        connected.wait()
        while not stop.is_set():
            row = connection.execute(CLAIM, (QUEUE,)).fetchone()
            if row is None:
                time.sleep(POLL_SECONDS)
                continue
            recorder.record(row[1])
            if pause:
                time.sleep(pause)
            connection.execute(DONE, (row[0],))


def serve(config: PeerConfig, out: str) -> None:
    """The worker: `concurrency` threads until SIGTERM, then the record to OUT."""
    recorder = LockedRecorder(config)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    connected = threading.Barrier(config.concurrency + 1, timeout=30)  # broken if one fails
    threads = [
        threading.Thread(target=_work, args=(config, recorder, connected, stop), name=f"pg-{n}")
        for n in range(config.concurrency)
    ]
    for thread in threads:
        thread.start()
    connected.wait()
    say("ready")
    while not stop.wait(0.2):
        pass
    for thread in threads:
        thread.join()
    recorder.write(out)


@contextmanager
def sender(config: PeerConfig) -> Iterator[Any]:
    """The seed's `enqueue` of a hot job, on one connection."""
    with psycopg.connect(config.url, autocommit=True) as connection:

        def send(payload: dict[str, Any]) -> None:
            connection.execute(ENQUEUE, (QUEUE, Jsonb(payload), HOT))

        yield send
