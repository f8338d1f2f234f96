"""A cluster node's audit log, closed with events buffered and its audit topic not made yet:
the close starts no creation of the topic (a task that outlived the node's etcd client left
its connection open: an unclosed-transport ResourceWarning in the cluster tests)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from tidewire.cluster.audit import ClusterAudit
from tidewire.cluster.node import ClusterNode


class _BufferedAudit:
    """The broker's audit log as the close sees it: events buffered, so its flush asks the
    replication where to write (as security/audit.py's flush does)."""

    def __init__(self) -> None:
        self.replication: Any = None
        self.asked = 0

    async def flush(self) -> None:
        self.asked += 1
        assert self.replication.writable() is None  # the topic is not in the metadata

    def replicate(self, replication: object) -> None:
        self.replication = replication


def test_closing_with_events_buffered_starts_no_topic_creation() -> None:
    async def main() -> None:
        audit = _BufferedAudit()
        node = SimpleNamespace(
            node_id=1,
            started=True,  # the node sets it False only after the audit log is closed
            cache=SimpleNamespace(topics={}),
            broker=SimpleNamespace(audit=audit),
        )
        ca = ClusterAudit(cast(ClusterNode, node))
        audit.replicate(ca)
        await ca.close()
        assert audit.asked == 1
        assert audit.replication is None
        assert ca._create_task is None  # nothing left running against a closed etcd client

    asyncio.run(main())
