"""``GET /v1/cluster`` and ``GET /v1/cluster/partitions``: the cluster as the answering node
sees it (docs/cluster.md, "Metrics and dashboard"); the dashboard's Cluster page polls them.

- ``/v1/cluster``: the cluster's id, this node, the controller, every node (live ones with
  their addresses; a node named as a replica and not registered is listed as not live), and
  the partition counts: all, offline, under-replicated, under min ISR, and those this node
  leads.
- ``/v1/cluster/partitions``: each partition's leader, leader epoch, replicas, ISR and
  min_insync_replicas, with this node's replica's high watermark and log end, and the lag of
  the replicas as far as this node knows it (every follower's, where it leads; its own,
  where it follows). Filters: ``topic``, ``state`` (offline, under_replicated,
  under_min_isr).

- ``/v1/cluster/metrics``: the cluster's key figures, every live node's (asked through the
  nodes' own CLUSTER_METRICS, :mod:`tidewire.server.cluster_metrics`) and their sums, with
  the nodes that did not answer in time named in ``missing_nodes``.

Reassignments (docs/cluster.md, "Reassigning partitions"; as ``tidewire topic reassign`` and
the protocol's ALTER_REPLICATION):

- ``GET /v1/cluster/reassignments``: the moves under way over the cluster (describe on the
  cluster), with the records their new replicas still lack where this node leads;
- ``GET /v1/cluster/reassignments/{topic}``: each partition of the topic with its move, if
  any (describe on the topic);
- ``POST /v1/cluster/reassignments/{topic}``: start moves, to replica sets or to a
  replication factor (alter on the topic and on the cluster, as Kafka asks);
- ``DELETE /v1/cluster/reassignments/{topic}``: cancel moves under way (``partition``: which;
  none: all), back to the replicas each had (alter on the topic and on the cluster).

The routes on the cluster need describe on the cluster, those of a topic's moves describe or
alter on the topic (and alter on the cluster). On a single node they answer 404 with an
error saying it is not a cluster. (The redirects of publishes and reads are
:mod:`.cluster`'s.)
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field
from starlette.responses import Response

from tidewire.cluster import cluster_node, reassign
from tidewire.cluster.metrics import (
    ClusterSummary,
    PartitionRow,
    cluster_summary,
    cluster_totals,
    partition_rows,
)
from tidewire.errors import InvalidRequestError, TidewireError
from tidewire.server.cluster_metrics import cluster_figures
from tidewire.server.http._common import json_response, parse_body, request_body, responses
from tidewire.server.http.context import GatewayContext
from tidewire.server.http.errors import error_response
from tidewire.server.http.models import ErrorBody

__all__ = [
    "ClusterMetricsDoc",
    "ClusterMoveDoc",
    "ClusterMovesDoc",
    "ClusterNodeDoc",
    "ClusterPartitionDoc",
    "ClusterPartitionsDoc",
    "ClusterStatusDoc",
    "ReassignmentRequest",
    "TopicMovesDoc",
    "cluster_router",
]

#: Most partitions one answer lists (a bound on its size: ~200 bytes each, ~2 MB); narrow
#: with ``topic`` or ``state`` beyond it.
MAX_PARTITIONS = 10_000


class ClusterNodeDoc(BaseModel):
    """A node: registered in etcd now (``live``), or named as a replica and gone."""

    node_id: int
    live: bool
    host: str | None = Field(description="Its advertised host (null when not live).")
    port: int | None = Field(description="Its binary protocol port (null when not live).")
    http_port: int | None = Field(description="Its HTTP port (null: none, or not live).")
    kafka_port: int | None = Field(description="Its Kafka port (null: none, or not live).")
    controller: bool


class PartitionCountsDoc(BaseModel):
    total: int
    offline: int = Field(description="Without a leader.")
    under_replicated: int = Field(description="Fewer in-sync replicas than replicas.")
    under_min_isr: int = Field(
        description="Led, with fewer in-sync replicas than min_insync_replicas: acks=all "
        "produce is refused there."
    )
    led_here: int = Field(description="Led by the answering node.")
    led_here_under_replicated: int
    led_here_under_min_isr: int
    reassigning: int = Field(description="Being moved (a reassignment under way).")


class ClusterStatusDoc(BaseModel):
    """The cluster as the answering node's copy of the metadata holds it."""

    cluster_id: str
    node_id: int = Field(description="The answering node.")
    controller: int = Field(description="The controller's node id (-1: none now).")
    is_controller: bool = Field(description="Whether the answering node is the controller.")
    topics: int
    nodes: list[ClusterNodeDoc]
    partitions: PartitionCountsDoc


class NodeFiguresDoc(BaseModel):
    """One node's figures: counters since it started, rates over its last metrics sample,
    and its cluster state now."""

    node_id: int
    messages_in: int = Field(description="Messages appended by producers on this node.")
    messages_out: int = Field(description="Messages handed to readers by this node.")
    bytes_in: int = Field(description="Bytes of batches appended to its logs (replicas too).")
    bytes_out: int = Field(description="Bytes of batches read from its logs.")
    disk_used_bytes: int
    messages_in_per_s: float | None = Field(
        description="Over its last metrics sample (5 s by default; null: it keeps no "
        "samples, as without an HTTP gateway)."
    )
    bytes_in_per_s: float | None
    bytes_out_per_s: float | None
    partitions_led: int
    under_replicated_partitions: int = Field(description="Of those it leads.")
    under_min_isr_partitions: int = Field(description="Of those it leads.")
    reassigning_partitions: int = Field(description="Of those it leads, being moved.")
    offline_partitions: int = Field(
        description="Partitions without a leader: the controller's figure (-1 elsewhere)."
    )
    controller: bool
    isr_shrinks: int
    isr_expands: int
    leader_elections: int = Field(description="Leaders it named as the controller.")
    replica_fetch_errors: int
    lease_losses: int
    lease_stale: bool = Field(
        description="Its etcd lease is past its TTL and etcd does not answer (it keeps its "
        "roles meanwhile)."
    )
    lease_stale_periods: int


class ClusterTotalsDoc(BaseModel):
    """The figures of the nodes that answered, summed."""

    messages_in: int
    messages_out: int
    bytes_in: int
    bytes_out: int
    disk_used_bytes: int
    messages_in_per_s: float | None = Field(
        description="Summed over the nodes that know theirs (null: none does)."
    )
    bytes_in_per_s: float | None
    bytes_out_per_s: float | None
    partitions_led: int
    under_replicated_partitions: int
    under_min_isr_partitions: int
    reassigning_partitions: int
    offline_partitions: int = Field(description="The controller's figure (-1: it did not answer).")
    isr_shrinks: int
    isr_expands: int
    leader_elections: int
    replica_fetch_errors: int
    lease_losses: int
    lease_stale_periods: int
    nodes_lease_stale: int = Field(description="Nodes whose etcd lease is stale now.")


class ClusterMetricsDoc(BaseModel):
    node_id: int = Field(description="The answering node.")
    totals: ClusterTotalsDoc
    nodes: list[NodeFiguresDoc] = Field(description="The answering node first, then by id.")
    missing_nodes: list[int] = Field(
        description="Live nodes that did not answer within 5 s: not in nodes nor totals."
    )


class ClusterPartitionDoc(BaseModel):
    topic: str
    partition: int
    leader: int = Field(description="The leader's node id (-1: offline).")
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    min_insync_replicas: int
    state: Literal["online", "offline", "under_replicated", "under_min_isr"] = Field(
        description="offline (no leader), else under_min_isr, else under_replicated, else online."
    )
    high_watermark: int = Field(
        description="Of the answering node's replica (on a follower: as its leader last "
        "said); -1 where it holds none."
    )
    log_end_offset: int = Field(description="Of the answering node's replica (-1: none).")
    follower_lag: dict[str, int] = Field(
        description="Where the answering node leads: records each follower lacks of the "
        "leader's log end, by node id, as of its last fetch."
    )
    lag: int | None = Field(
        description="Where the answering node follows: records its replica lacks of the "
        "high watermark its leader last gave it (null elsewhere)."
    )


class ClusterMoveDoc(BaseModel):
    """A partition being moved (a reassignment under way), as the answering node sees it."""

    topic: str
    partition: int
    leader: int = Field(description="The leader's node id (-1: offline).")
    leader_epoch: int
    replicas: list[int] = Field(
        description="Its replicas now: while the move adds replicas, the target's and the "
        "leaving ones."
    )
    isr: list[int]
    target: list[int] = Field(description="The replicas it is to end with (first leads).")
    original: list[int] = Field(
        description="The replicas it had when the move started: what a cancel goes back to "
        "(empty: not known, for a move started before cancels existed)."
    )
    adding: list[int] = Field(description="Replicas the move adds.")
    removing: list[int] = Field(
        description="Replicas the move removes once the others are in sync."
    )
    records_left: int | None = Field(
        description="Where the answering node leads the partition: records the replicas being "
        "added still lack of its log end (null elsewhere: ask the leader's node)."
    )
    bytes_left: int | None = Field(
        description="The same in bytes (estimated from the offset index: at most one index "
        "interval over; null where records_left is)."
    )


class ClusterMovesDoc(BaseModel):
    node_id: int = Field(description="The answering node.")
    moves: list[ClusterMoveDoc]


class TopicMoveDoc(BaseModel):
    partition: int
    leader: int
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    target: list[int] = Field(description="The target of a move under way (empty: none).")
    original: list[int] = Field(
        description="Under a move: the replicas it had when the move started."
    )


class TopicMovesDoc(BaseModel):
    topic: str
    in_progress: int = Field(description="Partitions being moved.")
    partitions: list[TopicMoveDoc]


class ReassignmentRequest(BaseModel):
    """Start moves: ``replicas`` (partition -> node ids, the first leads) or
    ``replication_factor`` (every partition given that many replicas), not both."""

    replicas: dict[int, list[int]] | None = Field(
        default=None, description='Partition -> its new replicas, e.g. {"0": [2, 3, 1]}.'
    )
    replication_factor: int | None = Field(default=None, ge=1, le=1000)


class ClusterPartitionsDoc(BaseModel):
    node_id: int = Field(description="The answering node.")
    partitions: list[ClusterPartitionDoc]
    truncated: bool = Field(description=f"More matched than the {MAX_PARTITIONS:,} listed.")


def _state(r: PartitionRow) -> str:
    if r.offline:
        return "offline"
    if r.under_min_isr:
        return "under_min_isr"
    if r.under_replicated:
        return "under_replicated"
    return "online"


def _partition_doc(r: PartitionRow) -> dict[str, object]:
    return {
        "topic": r.topic,
        "partition": r.partition,
        "leader": r.leader,
        "leader_epoch": r.leader_epoch,
        "replicas": list(r.replicas),
        "isr": list(r.isr),
        "min_insync_replicas": r.min_insync,
        "state": _state(r),
        "high_watermark": r.high_watermark,
        "log_end_offset": r.log_end_offset,
        "follower_lag": {str(k): v for k, v in r.follower_lag.items()},
        "lag": r.lag if r.lag >= 0 else None,
    }


def _status_doc(s: ClusterSummary) -> dict[str, object]:
    def opt(v: int) -> int | None:
        return v if v >= 0 else None

    return {
        "cluster_id": s.cluster_id,
        "node_id": s.node_id,
        "controller": s.controller,
        "is_controller": s.is_controller,
        "topics": s.topics,
        "nodes": [
            {
                "node_id": n.node_id,
                "live": n.live,
                "host": n.host or None,
                "port": opt(n.port),
                "http_port": opt(n.http_port),
                "kafka_port": opt(n.kafka_port),
                "controller": n.controller,
            }
            for n in s.nodes
        ],
        "partitions": {
            "total": s.partitions,
            "offline": s.offline,
            "under_replicated": s.under_replicated,
            "under_min_isr": s.under_min_isr,
            "led_here": s.led_here,
            "led_here_under_replicated": s.led_under_replicated,
            "led_here_under_min_isr": s.led_under_min_isr,
            "reassigning": s.reassigning,
        },
    }


def _move_doc(r: PartitionRow) -> dict[str, object]:
    return {
        "topic": r.topic,
        "partition": r.partition,
        "leader": r.leader,
        "leader_epoch": r.leader_epoch,
        "replicas": list(r.replicas),
        "isr": list(r.isr),
        "target": list(r.target),
        "original": list(r.original),
        "adding": list(r.adding),
        "removing": list(r.removing),
        "records_left": r.records_left if r.records_left >= 0 else None,
        "bytes_left": r.bytes_left if r.bytes_left >= 0 else None,
    }


def _topic_moves_doc(topic: str, moves: list[reassign.PartitionMove]) -> dict[str, object]:
    return {
        "topic": topic,
        "in_progress": sum(1 for m in moves if m.target),
        "partitions": [
            {
                "partition": m.partition,
                "leader": m.leader,
                "leader_epoch": m.leader_epoch,
                "replicas": list(m.replicas),
                "isr": list(m.isr),
                "target": list(m.target),
                "original": list(m.original),
            }
            for m in moves
        ],
    }


def _not_a_cluster() -> Response:
    return error_response(
        InvalidRequestError(
            "this broker is a single node, not a node of a cluster (tidewire serve --cluster "
            "etcd://HOST:PORT makes one; docs/cluster.md)"
        ),
        status=404,
    )


_ANSWERS: dict[int | str, dict[str, Any]] = {
    **responses(),  # 400 (a bad query parameter) and 503
    403: {"model": ErrorBody, "description": "Without describe on the cluster."},
    404: {"model": ErrorBody, "description": "The broker is a single node, not a cluster."},
}
_TOPIC_ANSWERS: dict[int | str, dict[str, Any]] = {
    **responses(),  # 400 (a bad body or query, a refused move) and 503
    403: {
        "model": ErrorBody,
        "description": "Without describe on the topic (GET), or alter on the topic and on "
        "the cluster (POST, DELETE).",
    },
    404: {
        "model": ErrorBody,
        "description": "No such topic, or the broker is a single node, not a cluster.",
    },
    504: {
        "model": ErrorBody,
        "description": "etcd did not answer (the change may be made all the same).",
    },
}


def cluster_router(ctx: GatewayContext) -> APIRouter:
    """The routes ``/v1/cluster`` and ``/v1/cluster/partitions``."""
    router = APIRouter(tags=["cluster"])
    broker = ctx.broker

    @router.get("/v1/cluster", response_model=ClusterStatusDoc, responses=_ANSWERS)
    async def cluster_status() -> Response:
        """The cluster as this node sees it: the controller, every node (live or gone, with
        its addresses) and the partition counts by state (offline, under-replicated, under
        min ISR, led here). 404 on a single node."""
        node = cluster_node(broker)
        if node is None:
            return _not_a_cluster()
        return json_response(_status_doc(cluster_summary(node)))

    @router.get("/v1/cluster/metrics", response_model=ClusterMetricsDoc, responses=_ANSWERS)
    async def cluster_metrics() -> Response:
        """The cluster's key figures: every live node's (messages and bytes in and out, rates,
        partitions led, under-replicated, under min ISR, ISR shrinks, lease state) and their
        sums; live nodes that did not answer within 5 s are named in ``missing_nodes`` (still
        200: a partial answer). 404 on a single node."""
        node = cluster_node(broker)
        if node is None:
            return _not_a_cluster()
        node._check_started()
        got = await cluster_figures(node)
        return json_response(
            {
                "node_id": node.node_id,
                "totals": cluster_totals(got.nodes),
                "nodes": [msgspec.to_builtins(n, order="deterministic") for n in got.nodes],
                "missing_nodes": got.missing_nodes,
            }
        )

    @router.get("/v1/cluster/partitions", response_model=ClusterPartitionsDoc, responses=_ANSWERS)
    async def cluster_partitions(
        topic: str | None = Query(None, description="Only this topic's partitions."),
        state: Literal["offline", "under_replicated", "under_min_isr"] | None = Query(
            None,
            description="Only partitions in this state (under_replicated includes those "
            "under min ISR and offline ones short of replicas).",
        ),
    ) -> Response:
        """Every partition of the cluster: leader, leader epoch, replicas, ISR and
        min_insync_replicas, with this node's high watermark and log end and the replicas'
        lag as far as this node knows it. 404 on a single node."""
        node = cluster_node(broker)
        if node is None:
            return _not_a_cluster()
        rows = partition_rows(node)
        if topic is not None:
            rows = [r for r in rows if r.topic == topic]
        if state == "offline":
            rows = [r for r in rows if r.offline]
        elif state == "under_replicated":
            rows = [r for r in rows if r.under_replicated]
        elif state == "under_min_isr":
            rows = [r for r in rows if r.under_min_isr]
        return json_response(
            {
                "node_id": node.node_id,
                "partitions": [_partition_doc(r) for r in rows[:MAX_PARTITIONS]],
                "truncated": len(rows) > MAX_PARTITIONS,
            }
        )

    @router.get("/v1/cluster/reassignments", response_model=ClusterMovesDoc, responses=_ANSWERS)
    async def cluster_reassignments(
        topic: str | None = Query(None, description="Only this topic's moves."),
    ) -> Response:
        """The partitions being moved over the cluster: replicas, target, the replicas the
        move adds and removes, and (where this node leads) the records still to copy. 404 on
        a single node."""
        node = cluster_node(broker)
        if node is None:
            return _not_a_cluster()
        rows = [r for r in partition_rows(node) if r.moving and topic in (None, r.topic)]
        return json_response(
            {"node_id": node.node_id, "moves": [_move_doc(r) for r in rows[:MAX_PARTITIONS]]}
        )

    @router.get(
        "/v1/cluster/reassignments/{topic}",
        response_model=TopicMovesDoc,
        responses=_TOPIC_ANSWERS,
    )
    async def topic_reassignment(topic: str) -> Response:
        """Each partition of ``topic`` with the target of its move under way, if any."""
        node = cluster_node(broker)
        if node is None:
            return _not_a_cluster()
        return json_response(_topic_moves_doc(topic, reassign.status(node, topic)))

    @router.post(
        "/v1/cluster/reassignments/{topic}",
        response_model=TopicMovesDoc,
        responses=_TOPIC_ANSWERS,
        openapi_extra={"requestBody": request_body(ReassignmentRequest)},
    )
    async def start_reassignment(topic: str, request: Request) -> Response:
        """Start moving ``topic``'s partitions, to the replica sets ``replicas`` or to
        ``replication_factor`` replicas each: new replicas copy the log and join the ISR,
        then the leader moves if it is not among them and the replicas left delete their
        logs. Answered once etcd holds the targets (follow with GET)."""
        node = cluster_node(broker)
        if node is None:
            return _not_a_cluster()
        req = parse_body(ReassignmentRequest, await request.body())
        changes = (
            f"replication_factor={req.replication_factor}"
            if req.replicas is None
            else "replicas "
            + "; ".join(f"{p}:{','.join(map(str, r))}" for p, r in sorted(req.replicas.items()))
        )
        try:
            moves = await reassign.reassign(
                node, topic, req.replicas, replication_factor=req.replication_factor
            )
        except TidewireError as exc:
            _audit(topic, changes, exc)
            raise
        _audit(topic, changes, None)
        return json_response(_topic_moves_doc(topic, moves))

    @router.delete(
        "/v1/cluster/reassignments/{topic}",
        response_model=TopicMovesDoc,
        responses=_TOPIC_ANSWERS,
    )
    async def cancel_reassignment(
        topic: str,
        partition: Annotated[
            list[int] | None,
            Query(description="A partition whose move to cancel (repeat; none: every one)."),
        ] = None,
    ) -> Response:
        """Cancel moves under way of ``topic`` (Kafka's KIP-455): each partition goes back to
        the replicas it had when its move started, the replicas it was adding removed. A
        move that ended meanwhile stays done."""
        node = cluster_node(broker)
        if node is None:
            return _not_a_cluster()
        parts = partition or []
        changes = f"cancel {','.join(map(str, parts)) or 'every move'}"
        try:
            moves = await reassign.cancel(node, topic, parts)
        except TidewireError as exc:
            _audit(topic, changes, exc)
            raise
        _audit(topic, changes, None)
        return json_response(_topic_moves_doc(topic, moves))

    def _audit(topic: str, changes: str, error: TidewireError | None) -> None:
        if broker.audit is not None:
            broker.audit.event(
                "ALTER_REPLICATION",
                "failed" if error is not None else "ok",
                resource=f"topic:{topic}",
                reason=error.message if error is not None else "",
                detail={"changes": changes},
            )

    return router
