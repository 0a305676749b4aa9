"""What a private node (`bandgate dev`, the tests, the benchmarks) is configured with, as the
running broker reports it."""

from __future__ import annotations

import pytest

from bandgate.ops.local_broker import QUORUM_WAL_MAX_SIZE_BYTES
from tests.broker import TestBroker


def test_the_quorum_queues_wal_rolls_over_at_bandgates_size(broker: TestBroker) -> None:
    """The key differs by version (`raft.` before 4.3, `quorum_queue.` from 4.3): the Ra system
    that quorum queues run in must hold the size, whichever key the node was given."""
    if broker.node is None:
        pytest.skip("the session's broker is not a private node")
    size = broker.node.ctl("eval", "maps:get(wal_max_size_bytes, ra_system:fetch(quorum_queues)).")
    assert int(size.strip()) == QUORUM_WAL_MAX_SIZE_BYTES
