"""The protocol's ``TAKE``: the msgbus mode's pop, answered by the leader of the topic's
partition, and the forwarding of a pop by a node of a cluster that does not lead it.

In a cluster one node must serialize the pops of a topic, or two nodes reading the same
committed offset would both hand out the message there. That node is the leader of the
topic's partition: a msgbus listener on another node sends the pop there as ``TAKE``
(through its routed internal client, as the node itself, following the leader when it
moves) and answers with what the leader took. The leader takes it with the same
:class:`~._pop.Popper` locks as its own msgbus listener's pops, so the two never interleave.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from tidewire.errors import TidewireError, UnknownTopicError
from tidewire.protocol.messages import TakeRequest, TakeResponse
from tidewire.server.http._cursor import Record
from tidewire.server.http.compat._pop import Popper

if TYPE_CHECKING:
    from tidewire.broker import Broker
    from tidewire.server.http.peers import PeerClient

__all__ = ["Taken", "accept_alive", "take", "take_on_leader"]


class Taken:
    """A record the leader took: its offset, timestamp and value."""

    __slots__ = ("offset", "timestamp", "value")

    def __init__(self, offset: int, timestamp: int, value: bytes) -> None:
        self.offset = offset
        self.timestamp = timestamp
        self.value = value


def accept_alive(ttl_ms: int) -> Callable[[Record], bool]:
    """Whether a record has not expired yet (published less than ``ttl_ms`` ago; 0: never
    expires)."""
    if ttl_ms <= 0:
        return lambda _: True
    now = int(time.time() * 1000)
    return lambda rec: rec.timestamp + ttl_ms > now


async def take(broker: Broker, req: TakeRequest) -> TakeResponse:
    """Answer a ``TAKE`` (see the module docstring): on the leader of the topic's partition
    (elsewhere NotLeaderError, so the sender finds the leader), one record taken for the
    group, or none (``found`` false)."""
    try:
        rep = broker.replication
        if rep is not None:
            rep.check_leader(req.topic, 0)
        if req.topic not in broker.topics():
            raise UnknownTopicError(f"topic {req.topic!r} does not exist")
        popper = Popper(broker, req.group, asyncio.Event())  # no wait: never closing
        rec = await popper.pop(req.topic, accept=accept_alive(req.ttl_ms))
    except TidewireError as exc:
        return TakeResponse(error_code=exc.code, error_message=exc.message)
    if rec is None:
        return TakeResponse()
    return TakeResponse(
        found=True, offset=rec.offset, timestamp_ms=rec.timestamp, value=rec.value or b""
    )


async def take_on_leader(peer: PeerClient, topic: str, group: str, ttl_ms: int) -> Taken | None:
    """A pop sent to the leader of ``topic``'s partition (found again when it moves): what
    it took, None when there was nothing.

    Raises:
        TidewireError: what the leader refused it with; NotLeaderError, ...: no leader
            answered within the peer client's timeout.
    """
    body = await peer.routed_body(topic, 0, TakeRequest(topic=topic, group=group, ttl_ms=ttl_ms))
    if not body.found:
        return None
    return Taken(body.offset, body.timestamp_ms, body.value)
