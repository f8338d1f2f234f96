"""A WebSocket stream's consumer group, wherever its coordinator is.

A group's coordinator is the leader of its partition of ``__consumer_offsets``: on a single
node, and in a cluster while this node leads that partition, the stream's member joins,
heartbeats, commits and leaves through this broker's coordinator directly, as before. In a
cluster, while another node coordinates the group, the same calls go there as the protocol's
JOIN_GROUP, HEARTBEAT, OFFSET_COMMIT, OFFSET_FETCH and LEAVE_GROUP through the node's routed
client (:class:`~.peers.PeerClient`, which finds the coordinator again when it moves). So a
WebSocket opened with ``?group=`` on any node is a member like any other; the choice is made
per call, so a coordinator that moves to (or away from) this node is followed (a member the
new coordinator does not know joins again, as any member does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tidewire.broker import Broker
from tidewire.client._routing import OFFSETS_TOPIC, coordinator_partition
from tidewire.cluster import cluster_node
from tidewire.errors import for_code
from tidewire.protocol.messages import (
    CommitPartition,
    GroupPartition,
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
)
from tidewire.server.http.peers import PeerClient

__all__ = ["GroupLink"]

TopicPartition = tuple[str, int]


def _raise(body: Any) -> None:
    code = getattr(body, "error_code", 0)
    if code:
        raise for_code(code)(body.error_message)


class GroupLink:
    """The calls a stream's member makes to its group's coordinator.

    Args:
        broker: this node's broker.
        group: the group id.
        peer: the routed client to use (its owner closes it); None: one of its own, made
            when first needed.
    """

    def __init__(self, broker: Broker, group: str, peer: PeerClient | None = None) -> None:
        self.broker = broker
        self.group = group
        self._peer = peer
        self._owned = False

    def _here(self) -> bool:
        """Whether this broker coordinates the group now (always on a single node)."""
        rep = self.broker.replication
        if rep is None or cluster_node(self.broker) is None:
            return True
        return rep.leads(OFFSETS_TOPIC, coordinator_partition(self.group))

    def _remote(self) -> PeerClient:
        if self._peer is None:
            node = cluster_node(self.broker)
            assert node is not None  # _here() is True on a single node
            self._peer = PeerClient(node)
            self._owned = True
        return self._peer

    async def close(self) -> None:
        """Close the connections to other nodes (if any were opened)."""
        if self._peer is not None and self._owned:
            await self._peer.close()
            self._peer = None

    async def join(
        self,
        *,
        member_id: str,
        client_id: str,
        topics: Sequence[str],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
    ) -> tuple[str, int, list[TopicPartition]]:
        """Join (again): the member id, the generation and this member's partitions.

        Raises:
            GroupFullError, InconsistentGroupProtocolError, RebalanceInProgressError,
            UnknownMemberError, NotCoordinatorError: as the coordinator answers.
        """
        if self._here():
            res = await self.broker.groups.coordinator.join(
                self.group,
                member_id=member_id,
                client_id=client_id,
                topics=topics,
                session_timeout_ms=session_timeout_ms,
                rebalance_timeout_ms=rebalance_timeout_ms,
            )
            return res.member_id, res.generation, list(res.assignment)
        body = await self._remote().group_request(
            self.group,
            JoinGroupRequest(
                group_id=self.group,
                member_id=member_id,
                client_id=client_id,
                topics=list(topics),
                session_timeout_ms=session_timeout_ms,
                rebalance_timeout_ms=rebalance_timeout_ms,
            ),
        )
        _raise(body)
        return body.member_id, body.generation, [(a.topic, a.partition) for a in body.assignment]

    async def committed(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        """The group's committed offset of each of ``partitions`` that has one."""
        if self._here():
            got = self.broker.groups.committed(self.group, list(partitions))
            return {tp: c.offset for tp, c in got.items()}
        body = await self._remote().group_request(
            self.group,
            OffsetFetchRequest(
                group_id=self.group, partitions=[GroupPartition(t, p) for t, p in partitions]
            ),
        )
        _raise(body)
        return {(o.topic, o.partition): o.offset for o in body.offsets if o.offset >= 0}

    async def heartbeat(self, member_id: str, generation: int) -> None:
        """Keep the member's session alive.

        Raises:
            UnknownMemberError, RebalanceInProgressError, IllegalGenerationError,
            NotCoordinatorError: join again.
        """
        if self._here():
            self.broker.groups.coordinator.heartbeat(self.group, member_id, generation)
            return
        body = await self._remote().group_request(
            self.group,
            HeartbeatRequest(group_id=self.group, member_id=member_id, generation=generation),
        )
        _raise(body)

    async def leave(self, member_id: str) -> None:
        """Leave the group now (the others rebalance).

        Raises:
            UnknownMemberError, InvalidRequestError: not a member (any more).
        """
        if self._here():
            self.broker.groups.coordinator.leave(self.group, member_id)
            return
        body = await self._remote().group_request(
            self.group, LeaveGroupRequest(group_id=self.group, member_id=member_id)
        )
        _raise(body)

    async def commit(
        self, offsets: Mapping[TopicPartition, int], *, member_id: str, generation: int
    ) -> None:
        """Commit ``offsets`` (the next offset to read) as this member; returns once stored.

        Raises:
            TidewireError: fenced by a rebalance, or the offsets log refused.
        """
        if self._here():
            await self.broker.groups.commit(
                self.group,
                {tp: (off, "") for tp, off in offsets.items()},
                member_id=member_id,
                generation=generation,
            )
            return
        body = await self._remote().group_request(
            self.group,
            OffsetCommitRequest(
                group_id=self.group,
                member_id=member_id,
                generation=generation,
                partitions=[CommitPartition(t, p, off) for (t, p), off in offsets.items()],
            ),
        )
        for r in body.results:
            if r.error_code:
                raise for_code(r.error_code)(r.error_message)
