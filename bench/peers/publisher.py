"""`python -m bench.peers.publisher CONFIG OUT`: a peer's hot messages at a steady rate,
published through the peer's own client API (Celery's `apply_async`, Dramatiq's
`send_with_options`, an `INSERT` with psycopg), each payload carrying its publish time.

The pacing is `base.pace`; what it writes to OUT is what `bench.paced_publisher` writes: the
publish time of every measured message, by `seq`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import orjson

from bench.peers.base import PeerConfig, pace

Sender = Callable[[dict[str, Any]], None]


def _sender(config: PeerConfig) -> AbstractContextManager[Sender]:
    """The kind's publishing client, imported only when asked for."""
    if config.kind.startswith("celery"):
        from bench.peers import celery_app

        return celery_app.sender(config)
    if config.kind == "dramatiq":
        from bench.peers import dramatiq_app

        return dramatiq_app.sender(config)
    if config.kind == "pg":
        from bench.peers import pg_worker

        return pg_worker.sender(config)
    raise ValueError(f"no peer {config.kind!r}")


def main() -> None:
    config = PeerConfig(**json.loads(sys.argv[1]))
    with _sender(config) as send:
        sent = pace(config, send)
    Path(sys.argv[2]).write_bytes(orjson.dumps({str(seq): t for seq, t in sent.items()}))


if __name__ == "__main__":
    main()
