"""`python -m bench.peers.worker CONFIG OUT`: a peer's worker, as its users run it.

Celery and Dramatiq run as their own command lines (`celery worker`, `dramatiq`), exec'd in
place of this process; the PostgreSQL worker is a loop of this project's (`pg_worker`). Each
says `ready` once it consumes, stops on SIGTERM the way it stops in production (a warm
shutdown: the handlers in hand finish), and writes its `Recorder`'s record to OUT.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

from bench.peers.base import PeerConfig

Serve = Callable[[PeerConfig, str], None]


def _serve(kind: str) -> Serve:
    """The kind's entry point, imported only when asked for (each needs its own extra)."""
    if kind.startswith("celery"):
        from bench.peers import celery_app

        return celery_app.serve
    if kind == "dramatiq":
        from bench.peers import dramatiq_app

        return dramatiq_app.serve
    if kind == "pg":
        from bench.peers import pg_worker

        return pg_worker.serve
    raise ValueError(f"no peer {kind!r}")


def main() -> None:
    config = PeerConfig(**json.loads(sys.argv[1]))
    _serve(config.kind)(config, sys.argv[2])


if __name__ == "__main__":
    main()
