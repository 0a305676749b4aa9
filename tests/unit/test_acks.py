"""consumers.acks writes basic.ack frames itself: byte for byte what pamqp writes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands
from pamqp import frame as amqp_frame

from consumers.acks import ack_frame


@given(
    channel=st.integers(min_value=0, max_value=2**16 - 1),
    delivery_tag=st.integers(min_value=0, max_value=2**63 - 1),  # pamqp's long-long range
)
def test_an_ack_frame_is_what_pamqp_writes(channel: int, delivery_tag: int) -> None:
    expected = amqp_frame.marshal(commands.Basic.Ack(delivery_tag=delivery_tag), channel)
    assert ack_frame(channel, delivery_tag) == expected


def test_an_ack_frame_reads_back_as_that_ack() -> None:
    consumed, channel, method = amqp_frame.unmarshal(ack_frame(3, 12345))
    assert (consumed, channel) == (21, 3)
    assert isinstance(method, commands.Basic.Ack)
    assert method.delivery_tag == 12345
    assert not method.multiple
