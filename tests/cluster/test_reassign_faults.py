"""Reassignment under faults.

- A leader whose replica set changes while it goes on leading in the same epoch (a move adds
  or drops replicas) keeps its produces waiting for their replicas, judged by the new ISR:
  they are answered (with their offsets) once the replicas that stay in sync hold them,
  rather than failed for the producer to resend.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.cluster.test_replication import bounded, cluster, lead, msgs, until
from tidewire.client import AsyncClient

T = "orders"


def test_a_leader_whose_replicas_change_keeps_its_acks_all_waits(tmp_path: Path) -> None:
    """Node 3 stops copying, so an acks=all produce waits for it; node 2 holds the batch and
    stops fetching too. A move then drops node 3 from the ISR and adds a node 4 (not yet in
    sync) in the same epoch: the produce is answered at once from what node 2 was known to
    hold, without another fetch (a leader that forgot its followers' ends, or failed the
    wait, would leave it unanswered or refused)."""

    async def main() -> None:
        async with cluster(tmp_path) as (nodes, _):
            n1, n2, n3 = nodes
            n1.min_insync = 2
            await lead(nodes, n1, 0)
            await n3.rep.stop_replica(T, 0)
            async with AsyncClient(n1.addr, request_timeout_s=60) as c:
                pending = asyncio.ensure_future(c.produce(T, 0, msgs(b"a", b"b")))
                await until(lambda: n2.end() == 2, "node 2 holds the batch")
                # Node 2's fetch of offset 2 reported it holds the batch: then it stops too.
                leader_view = n1.rep.led_states()[(T, 0)]
                await until(lambda: leader_view.followers[2].log_end == 2, "its end seen")
                await n2.rep.stop_replica(T, 0)
                assert not pending.done()  # node 3, in the ISR, lacks it
                await n1.rep.become_leader(
                    T, 0, epoch=0, replicas=(1, 2, 3, 4), isr=(1, 2), min_insync=2
                )
                assert await bounded(pending) == 0
                hw = n1.rep.high_watermark(T, 0)
                assert hw == 2

    asyncio.run(asyncio.wait_for(main(), 120))
