"""The protocol's ``TAKE``: the msgbus mode's pop, answered by the leader of the topic's
partition, and the forwarding of a pop by a node of a cluster that does not lead it.

In a cluster one node must serialize the pops of a topic, or two nodes reading the same
committed offset would both hand out the message there. That node is the leader of the
topic's partition: a msgbus listener on another node sends the pop there as ``TAKE``
(through its routed internal client, as the node itself, following the leader when it
moves) and answers with what the leader took. The leader takes it with the same
:class:`~._pop.Popper` locks as its own msgbus listener's pops, so the two never interleave.

A forwarded pop whose connection breaks (or whose answer does not come in time) is sent
once more, with the same ``take_id``: the leader remembers the answers of recent ids
(:data:`REMEMBERED_TAKES`, for :data:`TAKE_ID_TTL_S`) and answers a repeated id with what it
took for the first (waiting for it when it is still running), taking nothing more. So the
retry neither takes a second message nor loses the first, when it reaches the same leader.
When the leader changed meanwhile, the new one does not know the id and takes the next
message: the one the former leader took is gone, as it was without the retry (never handed
out twice either way).
"""

from __future__ import annotations

import asyncio
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from tidewire.broker import Broker
from tidewire.errors import (
    ConnectionLostError,
    RequestTimedOutError,
    TidewireError,
    UnknownTopicError,
)
from tidewire.protocol.messages import TakeRequest, TakeResponse
from tidewire.server.http._cursor import Record
from tidewire.server.http.compat._pop import Popper

if TYPE_CHECKING:
    from tidewire.server.http.peers import PeerClient

__all__ = [
    "REMEMBERED_TAKES",
    "TAKE_ID_TTL_S",
    "Taken",
    "accept_alive",
    "take",
    "take_on_leader",
]

#: Take ids a leader remembers the answer of (the oldest forgotten first): far more than the
#: pops in flight from every node at once; a few hundred bytes each.
REMEMBERED_TAKES = 10_000
#: How long a take id's answer is remembered (s): longer than a forwarded pop's retry comes
#: (one request timeout after the first at most).
TAKE_ID_TTL_S = 120.0

#: Per broker: take id -> (when it was first asked, monotonic s; its answer, once known).
_ANSWERS: weakref.WeakKeyDictionary[
    Broker, OrderedDict[str, tuple[float, asyncio.Future[TakeResponse]]]
] = weakref.WeakKeyDictionary()


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
    group, or none (``found`` false); a ``take_id`` asked before (and remembered) is
    answered as it was the first time, nothing taken again."""
    if not req.take_id:
        return await _take_once(broker, req)
    answers = _ANSWERS.setdefault(broker, OrderedDict())
    now = time.monotonic()
    while answers:  # forget the expired (the oldest first) and those beyond the bound
        first_at, _ = next(iter(answers.values()))
        if now - first_at < TAKE_ID_TTL_S and len(answers) < REMEMBERED_TAKES:
            break
        answers.popitem(last=False)
    known = answers.get(req.take_id)
    if known is not None:
        try:
            return await asyncio.shield(known[1])
        except ConnectionLostError as exc:  # the first did not finish: it may have taken one
            return TakeResponse(error_code=exc.code, error_message=exc.message)
    done: asyncio.Future[TakeResponse] = asyncio.get_running_loop().create_future()
    answers[req.take_id] = (now, done)
    try:
        answer = await _take_once(broker, req)
    except BaseException:
        answers.pop(req.take_id, None)
        done.set_exception(
            ConnectionLostError(
                f"take {req.take_id} of {req.topic!r} was stopped before its answer"
            )
        )
        done.exception()  # retrieved: a waiting retry reads it, none may
        raise
    if answer.error_code:
        answers.pop(req.take_id, None)  # nothing was taken: a retry takes afresh
    done.set_result(answer)
    return answer


async def _take_once(broker: Broker, req: TakeRequest) -> TakeResponse:
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
    req = TakeRequest(topic=topic, group=group, ttl_ms=ttl_ms, take_id=uuid.uuid4().hex)
    try:
        body = await peer.routed_body(topic, 0, req)
    except (ConnectionLostError, RequestTimedOutError):
        # Its answer was lost: once more, with the same id (see the module docstring).
        body = await peer.routed_body(topic, 0, req)
    if not body.found:
        return None
    return Taken(body.offset, body.timestamp_ms, body.value)
