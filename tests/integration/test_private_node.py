"""What a private node (`bandgate dev`, the tests, the benchmarks) is configured with, as the
running broker reports it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bandgate.ops.local_broker import NO_BUSY_WAIT, QUORUM_WAL_MAX_SIZE_BYTES
from tests.broker import TestBroker


def test_the_quorum_queues_wal_rolls_over_at_bandgates_size(broker: TestBroker) -> None:
    """The key differs by version (`raft.` before 4.3, `quorum_queue.` from 4.3): the Ra system
    that quorum queues run in must hold the size, whichever key the node was given."""
    if broker.node is None:
        pytest.skip("the session's broker is not a private node")
    size = broker.node.ctl("eval", "maps:get(wal_max_size_bytes, ra_system:fetch(quorum_queues)).")
    assert int(size.strip()) == QUORUM_WAL_MAX_SIZE_BYTES


def test_the_schedulers_do_not_busy_wait(broker: TestBroker) -> None:
    """The node shares the machine's cores with Python processes (`NO_BUSY_WAIT`): its Erlang
    VM, running, was started with the flags (`erl` hands `+sbwt none` on as `-sbwt none`)."""
    if broker.node is None:
        pytest.skip("the session's broker is not a private node")
    pid = int(broker.node.ctl("eval", "os:getpid().").strip().strip('"'))
    arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    words = NO_BUSY_WAIT.split()
    for flag, value in zip(words[::2], words[1::2], strict=True):
        assert any(
            arguments[i] == b"-" + flag[1:].encode() and arguments[i + 1] == value.encode()
            for i in range(len(arguments) - 1)
        ), f"{flag} {value} not among {arguments!r}"
