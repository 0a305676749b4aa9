"""Peers in `python -m bench priority`: other systems' answers to "hot first under a backlog",
each run as its users run it, in processes of its own, in the same scenario as bandgate.

- `celery_peer`: Celery on RabbitMQ, as its documentation sets it up for priorities (one
  `x-max-priority` queue, prefetch multiplier 1, late acks, 16 threads), and with three
  queues consumed by one worker (`-Q hot,warm,cold`).
- `dramatiq_peer`: Dramatiq's `RabbitmqBroker(max_priority=...)`, 16 threads.
- `pg_peer`: a PostgreSQL table polled with `FOR UPDATE SKIP LOCKED` by 16 threads.

Celery's and Dramatiq's queues here are classic queues, as those libraries declare them: not
replicated, one copy of each message on one node. bandgate's bands are quorum queues
(replicated, Raft), except in the "bandgate classic bands" contender, which is there to tell
what the waterfall costs from what replication costs. All peers run on the bench's private
RabbitMQ node, except PostgreSQL, which runs on the machine's PostgreSQL server, in a database
of the bench's own that is dropped at the end.

Each peer's worker reports what `bench.worker_process` does (`waits`, `background`,
`duplicates`), with the same `Recorder`, and its hot publisher carries the publish time in the
payload through the peer's own client API. `base` holds the shared plumbing; each peer is a
`Peer` (the orchestrator's side) and a module its processes import (`*_app`, `pg_worker`).
The peers need the `bench` extra (`pip install -e '.[dev,bench]'`); a peer whose packages are
missing is left out with a note.
"""
