"""CLUSTER_METRICS (key 67) and ``GET /v1/cluster/metrics``: a cluster's key figures, node by
node and summed, asked of any node (docs/cluster.md, "Metrics and dashboard").

Each node answers for itself (:func:`local_figures`): what it counted since it started
(messages and bytes in and out, the disk its logs use, ISR shrinks and expands, leader
elections, replica fetch failures, lease losses and stale periods), the rates over its last
metrics sample (where it keeps samples: its HTTP gateway runs; null elsewhere), and its state
now (partitions it leads, of them under-replicated, under min ISR and being moved; whether
its etcd lease is stale; as the controller, the partitions without a leader).

The node asked (:func:`cluster_figures`) answers for itself and asks every other live node
(registered in etcd now) at once with ``CLUSTER_METRICS`` ``local``, as the node's own
identity over its ``replica_connect`` (its TLS and node credentials, as the audit query and
the replica fetchers do: ``cluster_action`` on the cluster, which the ``node`` role has).
A node that does not answer within :data:`ASK_TIMEOUT_S` is named in ``missing_nodes`` (a
partial answer, not a failure), as the audit query does.
:func:`~tidewire.cluster.metrics.cluster_totals` sums the answers.

Asking needs ``describe`` on the cluster (``local``: ``cluster_action``, the nodes' own
identity). A single node refuses it (:class:`~tidewire.errors.InvalidRequestError`).
Prometheus users keep scraping each node's ``/metrics`` and sum with ``sum by``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from tidewire.cluster import cluster_node
from tidewire.cluster.metrics import RATES, cluster_summary
from tidewire.errors import InvalidRequestError, TidewireError, for_code
from tidewire.observability.metrics import metrics_for
from tidewire.protocol.messages import (
    ApiKey,
    Body,
    ClusterMetricsRequest,
    ClusterMetricsResponse,
    NodeMetricsBody,
)

if TYPE_CHECKING:
    from tidewire.broker import Broker
    from tidewire.cluster.node import ClusterNode
    from tidewire.server.handlers import ServerInfo

__all__ = [
    "ASK_TIMEOUT_S",
    "CLUSTER_METRICS_HANDLERS",
    "cluster_figures",
    "local_figures",
]

log = logging.getLogger("tidewire.server.cluster_metrics")

#: How long the node asked waits for each other node's figures (s): a live node reads them
#: from memory in one pass over its partitions, well within this; one that does not answer
#: is named in ``missing_nodes`` rather than holding the answer up (the audit query's bound).
ASK_TIMEOUT_S = 5.0

Reply = tuple[Body | None, list[bytes]]


def _last_rates(broker: Broker) -> dict[str, float | None]:
    """The rates of the node's last metrics sample (observability/samples.py), None each
    where it keeps none (no HTTP gateway started its sampling, or metrics are off)."""
    ring = metrics_for(broker).samples
    series = getattr(ring, "series", None)
    out: dict[str, float | None] = {}
    for key in RATES:
        points = series.get(key) if series is not None else None
        out[key] = float(points[-1][1]) if points else None
    return out


def local_figures(node: ClusterNode) -> NodeMetricsBody:
    """This node's figures now (one pass over its partitions and the metadata)."""
    broker = node.broker
    s = cluster_summary(node)
    st = node.stats
    bytes_in = bytes_out = disk = 0
    for plog in list(broker.logs.logs.values()):
        bytes_in += plog.bytes_in
        bytes_out += plog.bytes_out
        disk += plog.size_bytes
    return NodeMetricsBody(
        node_id=node.node_id,
        messages_in=broker.stats.published,
        messages_out=broker.stats.delivered,
        bytes_in=bytes_in,
        bytes_out=bytes_out,
        disk_used_bytes=disk,
        **_last_rates(broker),
        partitions_led=s.led_here,
        under_replicated_partitions=s.led_under_replicated,
        under_min_isr_partitions=s.led_under_min_isr,
        reassigning_partitions=s.led_reassigning,
        offline_partitions=s.offline if s.is_controller else -1,
        controller=s.is_controller,
        isr_shrinks=st.isr_shrinks,
        isr_expands=st.isr_expands,
        leader_elections=st.leader_elections,
        replica_fetch_errors=st.fetch_errors,
        lease_losses=st.lease_losses,
        lease_stale=node.lease.stale.is_set(),
        lease_stale_periods=node.etcd.stats.lease_stale_periods,
    )


async def _ask(node: ClusterNode, other: int) -> NodeMetricsBody | None:
    """Node ``other``'s own figures; None when it did not answer within
    :data:`ASK_TIMEOUT_S` (or could not be reached, or answered a retriable error).

    Raises:
        TidewireError: it refused with an error retrying cannot mend (such as a missing
            permission of the node principal).
    """
    info = node.cache.nodes.get(other)
    if info is None:
        return None
    from tidewire.cluster.fetcher import default_connect  # noqa: PLC0415 (the client's)

    link = (node.replica_connect or default_connect)(info.host, info.port)
    try:
        async with asyncio.timeout(ASK_TIMEOUT_S):
            response = await link.request(
                ClusterMetricsRequest(local=True), timeout_s=ASK_TIMEOUT_S
            )
    except (TimeoutError, OSError) as exc:
        log.warning("cluster metrics: node %d did not answer: %s", other, exc or "timed out")
        return None
    except TidewireError as exc:
        if not exc.retriable:
            raise
        log.warning("cluster metrics: node %d did not answer: %s", other, exc)
        return None
    finally:
        await link.close()
    body = response.body
    assert isinstance(body, ClusterMetricsResponse)
    if body.error_code:
        error = for_code(body.error_code)(
            f"node {other} did not give its figures: {body.error_message}"
        )
        if error.retriable:
            log.warning("cluster metrics: %s", error)
            return None
        raise error
    mine = [n for n in body.nodes if n.node_id == other]
    return mine[0] if mine else None


async def cluster_figures(node: ClusterNode) -> ClusterMetricsResponse:
    """Every live node's figures, this one's first then by node id, with the live nodes
    that did not answer in time named in ``missing_nodes`` (each asked at once, for at most
    :data:`ASK_TIMEOUT_S`).

    Raises:
        TidewireError: a node refused with an error retrying cannot mend.
    """
    others = sorted(n for n in node.cache.nodes if n != node.node_id)
    answers = await asyncio.gather(*(_ask(node, n) for n in others))
    got = [local_figures(node)]
    missing = []
    for n, body in zip(others, answers, strict=True):
        if body is None:
            missing.append(n)
        else:
            got.append(body)
    return ClusterMetricsResponse(nodes=got, missing_nodes=missing)


async def cluster_metrics(
    b: Broker, s: ServerInfo, req: ClusterMetricsRequest, _: memoryview
) -> Reply:
    node = cluster_node(b)
    try:
        if node is None:
            raise InvalidRequestError(
                "this broker is a single node, not a node of a cluster: its figures are its "
                "/metrics"
            )
        node._check_started()
        if req.local:
            return ClusterMetricsResponse(nodes=[local_figures(node)]), []
        return await cluster_figures(node), []
    except TidewireError as exc:
        return ClusterMetricsResponse(error_code=exc.code, error_message=exc.message), []


CLUSTER_METRICS_HANDLERS: dict[
    int, Callable[[Broker, ServerInfo, Any, memoryview], Awaitable[Reply]]
] = {ApiKey.CLUSTER_METRICS: cluster_metrics}
