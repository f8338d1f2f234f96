"""A cluster node's figures: what its Prometheus metrics, ``GET /v1/cluster`` and
``GET /v1/cluster/partitions`` and the dashboard's Cluster page show (docs/cluster.md,
"Metrics and dashboard").

Two kinds, as for the broker's other metrics (observability/metrics.py):

- **counted as it happens**, once per etcd request, replica fetch round, ISR change or
  election (never per record): :class:`EtcdStats` (kept by the etcd client, so it outlives
  the leases and controllers a node goes through) and :class:`ClusterStats` (kept by the
  node);
- **read at scrape time** from the node's copy of the metadata and its replica manager:
  partitions led, under-replicated, under min ISR, offline (on the controller), the lag of
  each replica (:func:`cluster_summary`, :func:`partition_rows`).

:func:`cluster_families` turns both into metric families; it yields nothing on a single node.
This module imports neither etcd's client nor the node (a single node never loads them): it
reaches the node through :func:`tidewire.cluster.cluster_node`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from tidewire.cluster import cluster_node

if TYPE_CHECKING:
    from tidewire.broker import Broker
    from tidewire.cluster.fetcher import Connect, ReplicaLink
    from tidewire.cluster.metadata import PartitionState
    from tidewire.cluster.node import ClusterNode
    from tidewire.protocol.messages import NodeMetricsBody

__all__ = [
    "ETCD_BUCKETS",
    "ClusterStats",
    "ClusterSummary",
    "EtcdStats",
    "NodeRow",
    "PartitionRow",
    "cluster_families",
    "cluster_summary",
    "cluster_totals",
    "counting_connect",
    "partition_rows",
]

#: etcd request latency buckets, seconds: from a read answered on loopback (~1 ms) to a
#: request that ran into the client's timeout (a third of the session, 2 s by default); a
#: controller's campaign waits while another node is the controller, so its own series
#: (op="campaign") lands in +Inf.
ETCD_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

#: NO_LEADER of the metadata (not imported: that would load msgspec's schemas of etcd).
_NO_LEADER = -1


@dataclass(slots=True)
class _Latency:
    """One op's histogram: counts per bucket (not cumulative), their sum in seconds."""

    buckets: list[int] = field(default_factory=lambda: [0] * (len(ETCD_BUCKETS) + 1))
    seconds: float = 0.0
    count: int = 0

    def observe(self, seconds: float) -> None:
        for i, bound in enumerate(ETCD_BUCKETS):
            if seconds <= bound:
                self.buckets[i] += 1
                break
        else:
            self.buckets[-1] += 1
        self.seconds += seconds
        self.count += 1


@dataclass(slots=True)
class EtcdStats:
    """The requests one etcd client made: per op (the gateway path's last part: range, put,
    txn, deleterange, grant, keepalive, revoke, timetolive, campaign, leader, resign), how
    many, how many failed (no endpoint answered, or etcd refused), and their latency; the
    lease renewals that failed; and the times a lease of this client went stale (past its TTL
    with etcd not answering: :attr:`~tidewire.cluster.etcd.Lease.stale`)."""

    requests: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    latency: dict[str, _Latency] = field(default_factory=dict)
    keepalive_failures: int = 0
    lease_stale_periods: int = 0

    def observe(self, path: str, seconds: float, *, ok: bool) -> None:
        """One request to ``path`` answered (or failed) after ``seconds``."""
        op = path.rstrip("/").rsplit("/", 1)[-1] or path
        self.requests[op] = self.requests.get(op, 0) + 1
        if not ok:
            self.errors[op] = self.errors.get(op, 0) + 1
        got = self.latency.get(op)
        if got is None:
            got = self.latency[op] = _Latency()
        got.observe(seconds)


@dataclass(slots=True)
class ClusterStats:
    """A node's cluster events since it started."""

    #: ISR changes this node made as a leader and etcd took: fewer members, more members.
    isr_shrinks: int = 0
    isr_expands: int = 0
    #: Leaderships this node gave as the controller (a new leader; unclean: one from
    #: outside the ISR), and partitions it left without a leader.
    leader_elections: int = 0
    unclean_elections: int = 0
    partitions_offlined: int = 0
    #: REPLICA_FETCH requests this node sent to its leaders, those that failed (connection
    #: lost, timeout, refused), and the bytes of batches they brought.
    fetch_requests: int = 0
    fetch_errors: int = 0
    fetch_bytes: int = 0
    #: Times this node lost its etcd lease (and stopped leading until it registered again).
    lease_losses: int = 0
    #: Bytes of sealed segments the background scrub CRC-checked (cluster/scrub.py), and
    #: the damaged ranges it found that no read had found before.
    scrub_bytes: int = 0
    scrub_damage: int = 0

    def isr_changed(self, before: tuple[int, ...], after: tuple[int, ...]) -> None:
        """A leader's ISR change, ``before`` -> ``after``, was taken by etcd (the same
        members again, proposed from a view behind etcd's, change nothing)."""
        if set(after) == set(before):
            return
        if set(after) < set(before):
            self.isr_shrinks += 1
        elif set(after) > set(before):
            self.isr_expands += 1
        else:  # members swapped: one left, another joined
            self.isr_shrinks += 1
            self.isr_expands += 1

    def controller_wrote(self, before: PartitionState, after: PartitionState) -> None:
        """The controller wrote ``after`` over ``before`` (etcd took it)."""
        if after.leader == before.leader:
            return
        if after.leader == _NO_LEADER:
            self.partitions_offlined += 1
            return
        self.leader_elections += 1
        if after.leader not in before.isr:
            self.unclean_elections += 1


class _CountingLink:
    """A replica link that counts its requests, failures and the bytes they brought."""

    def __init__(self, link: ReplicaLink, stats: ClusterStats) -> None:
        self._link = link
        self._stats = stats

    async def request(self, body: Any, data: Any = (), *, timeout_s: float | None = None) -> Any:
        st = self._stats
        st.fetch_requests += 1
        try:
            got = await self._link.request(body, data, timeout_s=timeout_s)
        except BaseException:
            st.fetch_errors += 1
            raise
        st.fetch_bytes += len(getattr(got, "data", b"") or b"")
        return got

    async def close(self) -> None:
        await self._link.close()


def counting_connect(connect: Connect, stats: ClusterStats) -> Connect:
    """``connect``, whose links count into ``stats`` (the replica fetch figures)."""

    def wrapped(host: str, port: int) -> ReplicaLink:
        return _CountingLink(connect(host, port), stats)

    return wrapped


# --- snapshots of the node's view ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeRow:
    """A node of the cluster: registered now (live), or named as a replica and gone."""

    node_id: int
    live: bool
    host: str = ""
    port: int = -1
    http_port: int = -1
    kafka_port: int = -1
    controller: bool = False


@dataclass(frozen=True, slots=True)
class PartitionRow:
    """One partition as the answering node sees it.

    ``high_watermark`` and ``log_end_offset`` are those of this node's replica (-1 where it
    holds none; on a follower, the high watermark its leader last gave it).
    ``follower_lag`` (where this node leads): records each other replica lacks of the
    leader's log end, as of its last fetch. ``lag`` (where this node follows): records its
    replica lacks of the high watermark its leader last gave it (-1: not following, or no
    answer from the leader yet; the fetch error counters tell why). ``target`` and
    ``original``: the move under way (empty: none), its target replicas and those the
    partition had when it started (empty: not known). ``records_left`` (where this node
    leads a partition being moved): records the replicas being added still lack of its log
    end, and ``bytes_left`` their bytes (estimated from the offset index, at most one index
    interval over; -1 elsewhere).
    """

    topic: str
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    min_insync: int
    high_watermark: int = -1
    log_end_offset: int = -1
    follower_lag: dict[int, int] = field(default_factory=dict)
    lag: int = -1
    target: tuple[int, ...] = ()
    original: tuple[int, ...] = ()
    records_left: int = -1
    bytes_left: int = -1

    @property
    def moving(self) -> bool:
        """Whether a move of the partition is under way."""
        return bool(self.target)

    @property
    def adding(self) -> tuple[int, ...]:
        """The replicas the move under way adds (``original`` not known: those of the
        target not in sync yet)."""
        return _adding(self.target, self.original, self.isr)

    @property
    def removing(self) -> tuple[int, ...]:
        """The replicas the move under way removes."""
        return tuple(r for r in (self.original or self.replicas) if r not in self.target)

    @property
    def offline(self) -> bool:
        return self.leader == _NO_LEADER

    @property
    def under_replicated(self) -> bool:
        return len(self.isr) < len(self.replicas)

    @property
    def under_min_isr(self) -> bool:
        return not self.offline and len(self.isr) < self.min_insync


def _adding(
    target: tuple[int, ...], original: tuple[int, ...], isr: tuple[int, ...]
) -> tuple[int, ...]:
    if not target:
        return ()
    return tuple(r for r in target if r not in (original or isr))


@dataclass(frozen=True, slots=True)
class ClusterSummary:
    """The cluster as the node sees it: who it is, the controller, the nodes, and the
    partition counts (every partition of the metadata, and those this node leads)."""

    cluster_id: str
    node_id: int
    controller: int
    is_controller: bool
    nodes: tuple[NodeRow, ...]
    topics: int
    partitions: int
    offline: int
    under_replicated: int
    under_min_isr: int
    led_here: int
    led_under_replicated: int
    led_under_min_isr: int
    reassigning: int = 0
    led_reassigning: int = 0


def partition_rows(node: ClusterNode) -> list[PartitionRow]:
    """Every partition of the node's copy of the metadata, by topic and partition."""
    cache = node.cache
    broker = node.broker
    rep = broker.replication
    led = rep.led_states() if rep is not None else {}
    followed = rep.followed_high_watermarks() if rep is not None else {}
    min_isr = {name: node.min_insync_of(info) for name, info in cache.topics.items()}
    rows = []
    for (topic, p), (state, _) in sorted(cache.partitions().items()):
        if topic not in min_isr:
            continue  # its topic entry is not loaded (yet, or any more)
        key = (topic, p)
        plog = broker.logs.logs.get(key)
        hw = end = lag = left = left_bytes = -1
        follower_lag: dict[int, int] = {}
        target = cache.reassignments.get(key, ())
        original = cache.reassignment_origins.get(key, ()) if target else ()
        if plog is not None:
            end = plog.log_end_offset
            leader = led.get(key)
            if leader is not None:
                hw = leader.high_watermark
                follower_lag = {
                    r: max(leader.log_end - f.log_end, 0)
                    for r, f in sorted(leader.followers.items())
                }
                if target:  # a replica not heard of yet lacks the whole log
                    whole = max(leader.log_end - plog.log_start_offset, 0)
                    new = _adding(target, original, state.isr)
                    left = sum(follower_lag.get(r, whole) for r in new)
                    left_bytes = sum(
                        plog.bytes_after(f.log_end)
                        if (f := leader.followers.get(r)) is not None
                        else plog.size_bytes
                        for r in new
                    )
            elif followed.get(key, -1) >= 0:  # not known before the leader's first answer
                hw = min(followed[key], end)
                lag = max(followed[key] - end, 0)
        rows.append(
            PartitionRow(
                topic,
                p,
                state.leader,
                state.leader_epoch,
                tuple(state.replicas),
                tuple(state.isr),
                min_isr[topic],
                hw,
                end,
                follower_lag,
                lag,
                target,
                original,
                left,
                left_bytes,
            )
        )
    return rows


def cluster_summary(node: ClusterNode, rows: list[PartitionRow] | None = None) -> ClusterSummary:
    """The node's view of the cluster (``rows``: :func:`partition_rows`, when at hand)."""
    rows = partition_rows(node) if rows is None else rows
    cache = node.cache
    controller = cache.controller
    named = {r for row in rows for r in row.replicas}
    nodes = []
    for n in sorted(set(cache.nodes) | named):
        info = cache.nodes.get(n)
        if info is None:
            nodes.append(NodeRow(n, False, controller=n == controller))
        else:
            nodes.append(
                NodeRow(
                    n,
                    True,
                    info.host,
                    info.port,
                    info.http_port,
                    info.kafka_port,
                    n == controller,
                )
            )
    mine = [r for r in rows if r.leader == node.node_id]
    leading = node.controller is not None and node.controller.leading.is_set()
    return ClusterSummary(
        cluster_id=node.cluster_id,
        node_id=node.node_id,
        controller=controller,
        is_controller=leading,
        nodes=tuple(nodes),
        topics=len(cache.topics),
        partitions=len(rows),
        offline=sum(r.offline for r in rows),
        under_replicated=sum(r.under_replicated for r in rows),
        under_min_isr=sum(r.under_min_isr for r in rows),
        led_here=len(mine),
        led_under_replicated=sum(r.under_replicated for r in mine),
        led_under_min_isr=sum(r.under_min_isr for r in mine),
        reassigning=sum(r.moving for r in rows),
        led_reassigning=sum(r.moving for r in mine),
    )


# --- the cluster's figures summed (GET /v1/cluster/metrics, tidewire cluster status) ---------

#: The figures :func:`totals` sums over the nodes (the rates over those that know theirs).
SUMMED = (
    "messages_in",
    "messages_out",
    "bytes_in",
    "bytes_out",
    "disk_used_bytes",
    "partitions_led",
    "under_replicated_partitions",
    "under_min_isr_partitions",
    "reassigning_partitions",
    "isr_shrinks",
    "isr_expands",
    "leader_elections",
    "replica_fetch_errors",
    "lease_losses",
    "lease_stale_periods",
)
RATES = ("messages_in_per_s", "bytes_in_per_s", "bytes_out_per_s")


def cluster_totals(nodes: Sequence[NodeMetricsBody]) -> dict[str, float | int | None]:
    """The figures of ``nodes`` summed (:data:`SUMMED`; the rates over the nodes that know
    theirs, None when none does), with ``nodes_lease_stale`` (nodes whose lease is stale
    now) and ``offline_partitions`` (the controller's figure; -1: no controller answered)."""
    out: dict[str, float | int | None] = {k: sum(getattr(n, k) for n in nodes) for k in SUMMED}
    for key in RATES:
        known = [v for n in nodes if (v := getattr(n, key)) is not None]
        out[key] = sum(known) if known else None
    out["nodes_lease_stale"] = sum(n.lease_stale for n in nodes)
    out["offline_partitions"] = next(
        (n.offline_partitions for n in nodes if n.controller and n.offline_partitions >= 0), -1
    )
    return out


# --- Prometheus ------------------------------------------------------------------------------


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc)
    g.add_metric([], value)
    return g


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    c = CounterMetricFamily(name, doc)
    c.add_metric([], value)
    return c


def cluster_families(broker: Broker, cap: int) -> Iterator[Metric]:
    """The cluster metric families of ``broker``'s node (none on a single node), with
    per-partition lag series for the first ``cap`` partitions (by topic and partition)."""
    node = cluster_node(broker)
    if node is None:
        return
    rows = partition_rows(node)
    s = cluster_summary(node, rows)
    yield _gauge(
        "tidewire_cluster_is_controller", "1 if this node is the controller now.", s.is_controller
    )
    yield _gauge(
        "tidewire_cluster_nodes_live",
        "Nodes registered in etcd now (this one included).",
        sum(n.live for n in s.nodes),
    )
    yield _gauge("tidewire_cluster_partitions_led", "Partitions this node leads.", s.led_here)
    yield _gauge(
        "tidewire_cluster_under_replicated_partitions",
        "Partitions this node leads with fewer in-sync replicas than replicas.",
        s.led_under_replicated,
    )
    yield _gauge(
        "tidewire_cluster_under_min_isr_partitions",
        "Partitions this node leads with fewer in-sync replicas than min_insync_replicas "
        "(acks=all produce is refused there).",
        s.led_under_min_isr,
    )
    yield _gauge(
        "tidewire_cluster_reassigning_partitions",
        "Partitions this node leads with a move (reassignment) under way.",
        s.led_reassigning,
    )
    yield _gauge(
        "tidewire_cluster_reassignment_records_left",
        "Records the replicas being added by the moves of partitions this node leads still "
        "lack of the leader's log end.",
        sum(r.records_left for r in rows if r.records_left > 0),
    )
    yield _gauge(
        "tidewire_cluster_reassignment_bytes_left",
        "Bytes the replicas being added by those moves still lack (estimated from the offset "
        "index: at most one index interval over).",
        sum(r.bytes_left for r in rows if r.bytes_left > 0),
    )
    if s.is_controller:  # as Kafka's OfflinePartitionsCount: the controller's figure
        yield _gauge(
            "tidewire_cluster_offline_partitions",
            "Partitions without a leader (exported by the controller only).",
            s.offline,
        )
    st: ClusterStats = node.stats
    for name, value, doc in (
        ("isr_shrinks", st.isr_shrinks, "ISR changes this node made as leader that removed"),
        ("isr_expands", st.isr_expands, "ISR changes this node made as leader that added"),
    ):
        yield _counter(f"tidewire_cluster_{name}", f"{doc} a replica (taken by etcd).", value)
    yield _counter(
        "tidewire_cluster_leader_elections",
        "Partition leaders this node named as the controller (failovers and returns).",
        st.leader_elections,
    )
    yield _counter(
        "tidewire_cluster_unclean_leader_elections",
        "Of those, leaders named from outside the ISR (unclean_leader_election).",
        st.unclean_elections,
    )
    yield _counter(
        "tidewire_cluster_partitions_offlined",
        "Partitions this node, as the controller, left without a leader (no in-sync replica "
        "alive).",
        st.partitions_offlined,
    )
    yield _counter(
        "tidewire_cluster_replica_fetch_requests",
        "REPLICA_FETCH requests this node sent to its partitions' leaders.",
        st.fetch_requests,
    )
    yield _counter(
        "tidewire_cluster_replica_fetch_errors",
        "Of those, requests that failed (connection lost, timeout, refused).",
        st.fetch_errors,
    )
    yield _counter(
        "tidewire_cluster_replica_fetch_bytes",
        "Bytes of record batches the replica fetches brought.",
        st.fetch_bytes,
    )
    yield _counter(
        "tidewire_cluster_lease_losses",
        "Times this node lost its etcd lease (it stopped leading and registered again).",
        st.lease_losses,
    )
    yield _counter(
        "tidewire_cluster_scrub_bytes",
        "Bytes of sealed segments the background scrub CRC-checked (--scrub-bytes-per-s).",
        st.scrub_bytes,
    )
    yield _counter(
        "tidewire_cluster_scrub_damage_found",
        "Damaged ranges the background scrub found in this node's replicas (none had been "
        "found by a read).",
        st.scrub_damage,
    )
    tl = ["topic", "partition"]
    lag = GaugeMetricFamily(
        "tidewire_cluster_replica_lag_records",
        "Records this node's replica of a partition it follows lacks of the high watermark "
        "its leader last gave it.",
        labels=tl,
    )
    flag = GaugeMetricFamily(
        "tidewire_cluster_follower_lag_records",
        "Records a follower lacks of this leader's log end, as of its last fetch.",
        labels=[*tl, "replica"],
    )
    shown = 0
    for r in rows:
        if r.lag < 0 and not r.follower_lag:
            continue
        if shown >= cap:
            break
        shown += 1
        if r.lag >= 0:
            lag.add_metric([r.topic, str(r.partition)], r.lag)
        for replica, n in r.follower_lag.items():
            flag.add_metric([r.topic, str(r.partition), str(replica)], n)
    yield lag
    yield flag
    yield _gauge(
        "tidewire_cluster_lease_stale",
        "1 while this node's etcd lease is past its TTL and etcd does not answer (the node "
        "keeps its roles; nothing is decided in etcd meanwhile), else 0.",
        node.lease.stale.is_set(),
    )
    yield from _etcd_families(node.etcd.stats)


def _etcd_families(es: EtcdStats) -> Iterator[Metric]:
    op = ["op"]
    requests = CounterMetricFamily(
        "tidewire_cluster_etcd_requests", "Requests this node made to etcd, by op.", labels=op
    )
    errors = CounterMetricFamily(
        "tidewire_cluster_etcd_request_errors",
        "Of those, requests that failed (no endpoint answered, or etcd refused), by op.",
        labels=op,
    )
    latency = HistogramMetricFamily(
        "tidewire_cluster_etcd_request_duration_seconds",
        "Time from a request to etcd to its answer (or failure), by op.",
        labels=op,
    )
    for name in sorted(es.requests):
        requests.add_metric([name], es.requests[name])
        errors.add_metric([name], es.errors.get(name, 0))
        h = es.latency.get(name)
        if h is None:
            continue
        acc = 0
        buckets: list[tuple[str, float]] = []
        for bound, n in zip(ETCD_BUCKETS, h.buckets, strict=False):
            acc += n
            buckets.append((repr(bound), acc))
        buckets.append(("+Inf", h.count))
        latency.add_metric([name], buckets, h.seconds)
    yield from (requests, errors, latency)
    yield _counter(
        "tidewire_cluster_lease_keepalive_failures",
        "Renewals of this node's etcd lease that failed (retried until the lease runs out).",
        es.keepalive_failures,
    )
    yield _counter(
        "tidewire_cluster_lease_stale_periods",
        "Times this node's etcd lease went past its TTL with etcd not answering (each stale "
        "period counted once, as it starts).",
        es.lease_stale_periods,
    )
