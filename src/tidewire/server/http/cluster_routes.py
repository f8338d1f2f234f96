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

Both need describe on the cluster. On a single node they answer 404 with an error saying it
is not a cluster. (The redirects of publishes and reads are :mod:`.cluster`'s.)
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field
from starlette.responses import Response

from tidewire.cluster import cluster_node
from tidewire.cluster.metrics import ClusterSummary, PartitionRow, cluster_summary, partition_rows
from tidewire.errors import InvalidRequestError
from tidewire.server.http._common import json_response, responses
from tidewire.server.http.context import GatewayContext
from tidewire.server.http.errors import error_response
from tidewire.server.http.models import ErrorBody

__all__ = [
    "ClusterNodeDoc",
    "ClusterPartitionDoc",
    "ClusterPartitionsDoc",
    "ClusterStatusDoc",
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


class ClusterStatusDoc(BaseModel):
    """The cluster as the answering node's copy of the metadata holds it."""

    cluster_id: str
    node_id: int = Field(description="The answering node.")
    controller: int = Field(description="The controller's node id (-1: none now).")
    is_controller: bool = Field(description="Whether the answering node is the controller.")
    topics: int
    nodes: list[ClusterNodeDoc]
    partitions: PartitionCountsDoc


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
        },
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

    return router
