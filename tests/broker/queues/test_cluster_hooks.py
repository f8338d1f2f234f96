"""The queue manager's cluster side against a stand-in cluster (tests/cluster/test_queues.py
has real nodes): what it does when a queue is served elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.broker.queues.test_manager import Clock, batch, run
from tidewire.broker import Broker
from tidewire.broker.queues.model import Binding, ExchangeSpec, QueueSpec
from tidewire.errors import NotLeaderError, RequestTimedOutError


class _Writes:
    async def check_leader(self) -> None:
        pass

    async def wait_replicated(self, end: int) -> None:
        pass


class _Log:
    def check_leader(self) -> None:
        pass

    async def wait_replicated(self, end: int) -> None:
        pass


class StandIn:
    """A cluster where this node owns the queues in ``owned`` and cannot reach the owners of
    the others (a forward is refused as retriable)."""

    def __init__(self, owned: set[str]) -> None:
        self.owned = owned
        self.forwards = 0

    def definitions(self) -> _Writes:
        return _Writes()

    def log_replication(self, topic: str, partition: int) -> _Log:
        return _Log()

    def owns(self, name: str) -> bool:
        return name in self.owned

    def not_owner(self, name: str) -> NotLeaderError:
        return NotLeaderError(f"queue {name!r} is served by node 9", leader_id=9)

    def owner_of(self, name: str) -> int:
        return 0 if name in self.owned else 9

    def transient_owner(self, name: str) -> int:
        return -1

    def transient_specs(self) -> dict[str, QueueSpec]:
        return {}

    async def claim_transient(self, spec: QueueSpec) -> None:
        pass

    async def release_transient(self, name: str) -> None:
        pass

    async def create_queue_topic(self, name: str) -> None:
        pass

    async def delete_queue_topic(self, name: str) -> None:
        pass

    async def forward(self, queue: str, data: bytes, *, ttl_ms: int, deliver_at_ms: int) -> None:
        self.forwards += 1
        raise RequestTimedOutError(f"the owner of {queue!r} did not answer")

    async def owner_usage(self, name: str) -> tuple[int, int]:
        raise RequestTimedOutError(f"the owner of {name!r} did not answer")

    async def delete_at_definitions_leader(self, name: str) -> None:
        raise RequestTimedOutError("the leader of the definitions did not answer")


def test_dead_letters_for_an_unreachable_owner_are_kept_not_dropped(tmp_path: Path) -> None:
    async def body(broker: Broker, clock: Clock) -> None:
        qm = broker.queues
        await qm.declare_exchange(ExchangeSpec("dlx", "direct"))
        await qm.declare_queue(QueueSpec("work", dead_letter_exchange="dlx"))
        cluster = StandIn(owned={"work"})
        qm.replicate(cluster)
        assert [q.spec.name for q in qm.queues()] == ["work"]  # served here again
        await qm.declare_queue(QueueSpec("dead"))  # known, served by another node
        await qm.bind(Binding("dlx", "dead", "queue", "work"))
        with pytest.raises(NotLeaderError):
            qm.describe_queue("dead")
        with pytest.raises(NotLeaderError):  # the client goes to the owner itself
            await qm.publish("", "dead", batch(b"x"))

        await qm.publish("", "work", batch(b"bad", key="work"))
        d = await qm.get("work", owner="c1")
        await qm.settle("work", [d.entries[0].tag], "dead-letter", owner="c1")
        await qm.wait_idle()
        assert cluster.forwards == 1
        st = qm.describe_queue("work")
        assert (st.ready, st.counters.dropped, st.counters.dead_lettered) == (1, 0, 0)
        again = await qm.get("work", owner="c1")
        assert again.entries[0].delivery_count == 2  # its count kept

    run(tmp_path, body)
