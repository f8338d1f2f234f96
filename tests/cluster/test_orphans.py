"""A node that was away while a topic was deleted: at its next start, once it has loaded the
cluster's metadata, it deletes the logs it still holds of that topic (they carry the id of a
topic the cluster no longer knows), and keeps a topic's logs that carry no id (made by a
single node before the data directory joined a cluster). Real etcd, in-process nodes."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from tests.cluster._etcd import EtcdServer
from tests.cluster.test_node import WAIT_S, Member
from tidewire.cluster.node import TOPIC_ID_FILE


def test_logs_of_a_topic_deleted_while_the_node_was_away_are_deleted_at_its_start(
    tmp_path: Path, etcd: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            a = Member(tmp_path, etcd, 1)
            await a.start(stack)
            assert a.node is not None
            async with AsyncExitStack() as b_stack:
                b = Member(tmp_path, etcd, 2)
                await b.start(b_stack)
                node_b = b.node
                assert node_b is not None
                await a.node.cache.wait_for(lambda: len(a.node.cache.nodes) == 2, WAIT_S)
                for name in ("gone", "kept"):
                    await a.node.create_topic(name, 2, a.broker.config.log, replication_factor=2)
                await node_b.wait_reconciled(
                    lambda: {("gone", 0), ("gone", 1), ("kept", 0)} <= set(node_b._applied),
                    WAIT_S,
                )
                # A topic of the data directory from before it joined a cluster: no id.
                b.broker.create_topic("single", partitions=1)
                gone_dirs = [Path(b.broker.logs.logs["gone", p].directory) for p in (0, 1)]
                assert all((d / TOPIC_ID_FILE).exists() for d in gone_dirs)
            # Node 2 is away: the topic is deleted meanwhile.
            await a.node.delete_topic("gone")
            assert all(d.exists() for d in gone_dirs)

            b2 = Member(tmp_path, etcd, 2)
            caplog.set_level("WARNING", logger="tidewire.cluster.node")
            await b2.start(stack)
            node_b2 = b2.node
            assert node_b2 is not None
            await node_b2.wait_reconciled(lambda: node_b2._orphans_checked, WAIT_S)
            assert "gone" not in b2.broker.logs.topic_names()
            assert not any(d.exists() for d in gone_dirs)
            assert {"kept", "single"} <= set(b2.broker.logs.topic_names())
            assert any("topic gone: deleting its logs here" in r.message for r in caplog.records)

    asyncio.run(main())
