"""A broker as a node of a cluster: its registration in etcd, its copy of the metadata, its
part in the controller's election, and the roles of its replicas.

:class:`ClusterNode` ties the pieces together:

- it registers the node's addresses under a lease of ``session_timeout_s`` (a node id is
  taken by one live node at a time), follows the metadata (:class:`MetadataCache`) and
  campaigns to be the controller (:class:`Controller`);
- a reconcile task makes the local replicas match the metadata: for every partition this
  node is a replica of, the local log exists (made with the topic's settings from etcd) and
  the replica manager (:mod:`tidewire.cluster.replication`) is told to lead it or to follow
  its leader; a topic deleted from etcd is deleted here. It acts only on changes (leader,
  leader epoch, replica set, the leader's address);
- topics are created and deleted through etcd (any node: replicas placed by
  :func:`~tidewire.cluster.controller.assign` over the live nodes), and METADATA answers from
  the node's copy: every live node, the controller, and each partition's leader and ISR;
- a leader changes its partition's ISR with :meth:`ClusterNode.propose_isr`, a
  compare-and-swap on the version it read (Kafka's AlterPartition);
- when etcd says its lease is lost (it was cut off from etcd, or paused, past the session
  timeout), the node stops leading: the others presumed it gone and elected new leaders. It
  then registers again, on a new lease. While etcd does not answer at all (its lease past
  its TTL by this node's clock, :attr:`Lease.stale`), nothing can be decided without it, so
  it keeps its roles, as Kafka's brokers keep theirs while the controller quorum is out of
  reach: what acks=all acknowledges stays safe, because the high watermark needs every
  in-sync follower, a follower told of a newer leader fetches from that one instead, and
  the ISR cannot shrink without etcd. It gives up only the partitions whose in-sync
  followers have all stopped fetching from it for a session timeout (cut off from them
  too: they may follow a new leader), and takes them up again once etcd answers;
- the consumer groups' committed offsets are the replicated topic ``__consumer_offsets``
  (created through etcd on first use: the first METADATA asking for it, which is how clients
  find a group's coordinator; :meth:`ClusterNode.ensure_offsets_topic`). A group's coordinator
  is the leader of its partition: the reconcile pass tells the broker's groups to take over
  a partition it now leads (loading its offsets from the local, replicated log) and to give
  up one it no longer leads (:class:`_OffsetsReplication` replicates their commits).

The request handlers reach the node through :func:`tidewire.cluster.cluster_node`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import msgspec

from tidewire.broker.offsets import (
    OFFSETS_PARTITIONS,
    OFFSETS_TOPIC,
    QUEUE_DEFINITIONS_TOPIC,
    STREAMS_TOPIC,
    internal_config,
    is_internal_topic,
)
from tidewire.cluster import attach_node, detach_node, reassign
from tidewire.cluster.audit import ClusterAudit
from tidewire.cluster.controller import Controller, assign
from tidewire.cluster.etcd import EtcdClient, EtcdError, Lease
from tidewire.cluster.fetcher import Connect, FollowedPartition, default_connect
from tidewire.cluster.lost_tail import LostTails, kernel_boot_id, same_boot
from tidewire.cluster.metadata import (
    NO_LEADER,
    MetadataCache,
    MetadataStore,
    NodeIdTakenError,
    NodeInfo,
    PartitionState,
    TopicInfo,
)
from tidewire.cluster.metrics import ClusterStats, counting_connect
from tidewire.cluster.queues import (
    ClusterQueues,
    check_definitions_incarnation,
    queue_of,
)
from tidewire.cluster.queues import include_new_nodes as include_queue_definitions
from tidewire.cluster.scrub import DEFAULT_SCRUB_BYTES_PER_S, Scrubber
from tidewire.cluster.security import (
    ClusterSecurity,
    DeadReplicas,
    check_security_incarnation,
    include_new_nodes,
)
from tidewire.cluster.streams import ClusterStreams, streams_role
from tidewire.errors import (
    InternalTopicError,
    InvalidConfigError,
    InvalidTopicError,
    NotCoordinatorError,
    NotEnoughReplicasError,
    NotLeaderError,
    RequestTimedOutError,
    TidewireError,
    TopicExistsError,
    UnknownTopicError,
)
from tidewire.protocol.messages import (
    DamageInfo,
    MetadataResponse,
    NodeAddress,
    PartitionInfo,
    TopicConfig,
    TopicDescription,
)
from tidewire.security._logs import SECURITY_TOPIC
from tidewire.storage import LogConfig, PartitionLog
from tidewire.storage.fs import write_atomic
from tidewire.storage.manager import validate_topic_name

if TYPE_CHECKING:
    from tidewire.broker import Broker
    from tidewire.cluster.replica_state import PartitionLeader

__all__ = [
    "DEFAULT_SESSION_TIMEOUT_S",
    "ClusterNode",
    "Replicas",
    "parse_cluster_url",
]

log = logging.getLogger("tidewire.cluster.node")

#: A node's lease: gone this long after its last renewal, the node is presumed dead and its
#: partitions are led by others (Kafka's broker session timeout is 9 s; etcd renews every
#: third of it).
DEFAULT_SESSION_TIMEOUT_S = 6
#: In each partition directory of a cluster's topic: the incarnation id of the topic it is
#: a replica of (:attr:`~tidewire.cluster.metadata.TopicInfo.topic_id`).
TOPIC_ID_FILE = "topic-id"
#: Keys of a topic's cluster settings in its config in etcd (beside the log settings).
MIN_INSYNC_KEY = "min_insync_replicas"
UNCLEAN_KEY = "unclean_leader_election"
#: The most partitions of a topic created here (the broker's own bound).
MAX_PARTITIONS = 100_000
#: How long a CREATE_TOPIC or DELETE_TOPIC waits for this node's copy (and logs) to follow
#: etcd before it answers with a timeout (the change is made in etcd all the same).
ADMIN_WAIT_S = 30.0
#: After a reconcile step failed (a log that could not be made, a leader whose address is not
#: known yet), the next pass comes this soon even without a change.
RETRY_S = 1.0
#: While the node's lease is stale (etcd not answering past its TTL), how often (s) the
#: leader checks that the in-sync followers of each partition it leads still fetch from it.
STALE_CHECK_S = 1.0
#: Re-registering after a lost lease: waits between attempts, doubling up to the cap.
REGISTER_BACKOFF_S = (0.2, 2.0)
#: Producer epoch bumps recorded within this long (s) share one etcd lease, of the producers'
#: expiration time plus this: each bump's key lives between the two (thousands of writers'
#: task attempts make as many bumps, not as many leases).
EPOCH_LEASE_SHARED_S = 3600


class _OffsetsReplication:
    """How the offsets store of a node's broker replicates its commits: appended only by the
    leader of the group's partition of ``__consumer_offsets`` (its ``acks=all`` rules: refused
    below ``min_insync_replicas``) and acknowledged once every in-sync replica holds it."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    def check_leader(self, partition: int) -> None:
        rep = self._broker.replication
        try:
            if rep is None:
                raise NotLeaderError("no replication")
            leader = rep.check_leader(OFFSETS_TOPIC, partition)
        except NotLeaderError as exc:
            raise NotCoordinatorError(
                f"{OFFSETS_TOPIC} partition {partition} is not led here: {exc.message}"
            ) from None
        if not leader.can_append_acks_all():
            raise NotEnoughReplicasError(
                f"{OFFSETS_TOPIC}/{partition}: {len(leader.isr)} in-sync replicas "
                f"{sorted(leader.isr)}, min_insync_replicas is {leader.min_insync}; "
                "the commit was not stored"
            )

    def appended(self, partition: int) -> None:
        self._broker._wake(OFFSETS_TOPIC, partition)

    async def wait_replicated(self, partition: int, end: int) -> None:
        rep = self._broker.replication
        if rep is None:
            raise NotCoordinatorError(f"{OFFSETS_TOPIC} partition {partition} is not led here")
        await rep.wait_replicated(OFFSETS_TOPIC, partition, end, rep.ack_timeout_s)


class Replicas(Protocol):
    """What the node needs of the replica manager (:class:`~tidewire.cluster.replication.
    ReplicaManager`)."""

    async def become_leader(
        self,
        topic: str,
        partition: int,
        *,
        epoch: int,
        replicas: tuple[int, ...],
        isr: tuple[int, ...],
        min_insync: int | None = None,
    ) -> None: ...

    async def become_follower(
        self,
        topic: str,
        partition: int,
        *,
        epoch: int,
        leader: int,
        leader_address: tuple[str, int],
    ) -> None: ...

    async def stop_replica(
        self, topic: str, partition: int, *, keep_high_watermark: bool = False
    ) -> None: ...

    def following(self, key: tuple[str, int]) -> FollowedPartition | None: ...

    def led_states(self) -> dict[tuple[str, int], PartitionLeader]: ...

    #: monotonic seconds, the clock of the followers' fetch times
    clock: Callable[[], float]

    async def close(self) -> None: ...


class Closable(Protocol):
    """What the node closes when it stops besides its own parts (the HTTP API's pool of
    connections to the other nodes, :class:`~tidewire.server.http.peers.PeerPool`)."""

    async def close(self) -> None: ...


def parse_cluster_url(url: str) -> list[str]:
    """``etcd://HOST:PORT[,HOST:PORT...]`` -> the etcd client URLs (``http://HOST:PORT``).

    Raises:
        InvalidConfigError: not of that form.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme != "etcd" or not rest:
        raise InvalidConfigError(f"--cluster {url!r}: expected etcd://HOST:PORT[,HOST:PORT...]")
    out = []
    for part in rest.rstrip("/").split(","):
        host, colon, port = part.strip().rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidConfigError(f"--cluster {url!r}: {part!r} is not HOST:PORT")
        out.append(f"http://{host}:{int(port)}")
    return out


def config_to_strings(cfg: LogConfig) -> dict[str, str]:
    """A topic's settings as etcd keeps them (:attr:`TopicInfo.config`)."""
    return {k: str(v) for k, v in cfg.to_dict().items()}


def config_of(info: TopicInfo, base: LogConfig) -> LogConfig:
    """The settings of a topic of the metadata: ``base`` with what its entry names."""
    values = base.to_dict()
    for k, v in info.config.items():
        if k in values:
            values[k] = v if k == "fsync" else int(v)
    return LogConfig.from_dict(values)


#: What was last applied to a local replica: ("leader", epoch, replicas, isr),
#: ("follower", epoch, leader, host, port) or ("offline", epoch).
_Role = tuple[object, ...]


class ClusterNode:
    """``broker`` as node ``node_id`` of the cluster whose metadata is in etcd.

    Args:
        broker: the started broker.
        node_id: this node's id (unique among the live nodes).
        etcd_endpoints: etcd's client URLs (``http://HOST:PORT``).
        advertise: where other nodes and clients reach this node's protocol listener.
        http_port: its HTTP API's port (-1: none), for the node list.
        cluster_id: the cluster's name (its keys live under ``/tidewire/<cluster_id>/``).
        kafka_port: its Kafka listener's advertised port (-1: none).
        kafka_host: its Kafka listener's advertised host ("": the ``advertise`` host).
        session_timeout_s: the lease's TTL (s).
        default_replication_factor: replicas of a topic created without a count (at most the
            live nodes).
        replica_lag_max_ms, min_insync_replicas: the replica manager's settings.
        replication: the replica manager (default: a
            :class:`~tidewire.cluster.replication.ReplicaManager` of ``broker``).
        replica_connect: how the default replica manager connects to leaders (see
            :func:`~tidewire.cluster.fetcher.node_connect`: TLS and the node's credentials
            when security is on); None: plaintext, unauthenticated.
        scrub_bytes_per_s: the background scrub's rate over the sealed segments of the
            partitions held here (cluster/scrub.py; 0: none). Only with the default replica
            manager.
    """

    def __init__(
        self,
        broker: Broker,
        node_id: int,
        etcd_endpoints: Sequence[str],
        *,
        advertise: tuple[str, int],
        http_port: int = -1,
        cluster_id: str = "default",
        kafka_port: int = -1,
        kafka_host: str = "",
        session_timeout_s: int = DEFAULT_SESSION_TIMEOUT_S,
        default_replication_factor: int = 3,
        replica_lag_max_ms: int = 10_000,
        min_insync_replicas: int = 1,
        replication: Replicas | None = None,
        replica_connect: Connect | None = None,
        scrub_bytes_per_s: int = DEFAULT_SCRUB_BYTES_PER_S,
    ) -> None:
        if node_id < 0:
            raise InvalidConfigError(f"--node-id {node_id}: a node id is >= 0")
        if session_timeout_s < 2:
            raise InvalidConfigError(f"--session-timeout {session_timeout_s}: at least 2 s")
        if default_replication_factor < 1:
            raise InvalidConfigError(
                f"--default-replication-factor {default_replication_factor}: at least 1"
            )
        self.broker = broker
        self.node_id = node_id
        self.info = NodeInfo(node_id, advertise[0], advertise[1], http_port, kafka_port, kafka_host)
        self.session_timeout_s = session_timeout_s
        self.default_replication_factor = default_replication_factor
        self.replica_lag_max_ms = replica_lag_max_ms
        self.min_insync_replicas = min_insync_replicas
        # Requests bounded well below the session, so a renewal can be tried again in time.
        self.etcd = EtcdClient(etcd_endpoints, timeout_s=max(1.0, session_timeout_s / 3))
        self.cluster_id = cluster_id
        self.store = MetadataStore(self.etcd, cluster_id)
        self.cache = MetadataCache(self.store, on_change=self._changed, retry_s=0.2)
        self.lease = Lease(self.etcd, ttl_s=session_timeout_s)
        #: replicas that may have lost their unflushed tail (see cluster/lost_tail.py)
        self.lost_tails = LostTails(self.store, node_id)
        #: the lease epoch bumps are recorded on now: (its id, loop time it was granted)
        self._epoch_lease: tuple[int, float] | None = None
        self.controller: Controller | None = None
        self.replication: Replicas | None = replication
        self.replica_connect = replica_connect
        if scrub_bytes_per_s < 0:
            raise InvalidConfigError(f"--scrub-bytes-per-s {scrub_bytes_per_s}: at least 0")
        self.scrub_bytes_per_s = scrub_bytes_per_s
        #: The background scrub of the replicas' sealed segments (with the default replica
        #: manager only), from start.
        self.scrubber: Scrubber | None = None
        #: Elections, ISR changes, replica fetches, lease losses (cluster/metrics.py).
        self.stats = ClusterStats()
        self._applied: dict[tuple[str, int], _Role] = {}
        #: partitions led here given up while etcd does not answer (see _check_stale)
        self._stepped_down: set[tuple[str, int]] = set()
        self._seen_topics: set[str] = set()
        #: Topics whose local logs were checked to be of the incarnation etcd names.
        self._verified: dict[str, str] = {}
        #: logs of topics etcd does not know were looked for (once, at the first pass)
        self._orphans_checked = False
        self._dirty = asyncio.Event()
        #: set after each reconcile pass: admin requests wait on it for their local effect
        self._passed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._offsets_task: asyncio.Task[None] | None = None
        #: lightweight streams: served where their partition of __streams is led
        self.stream_owners = ClusterStreams(self)
        #: The queues' side of the node (cluster/queues.py), from start.
        self.queues: ClusterQueues | None = None
        #: This node's audit log in the cluster: ``__audit.<node id>`` (cluster/audit.py).
        self.audit = ClusterAudit(self)
        #: Replicas of __security and the audit logs whose nodes are gone (for good, after
        #: cluster/security.py's DEAD_NODE_S): taken off those topics by their leader.
        self.dead_replicas = DeadReplicas(self)
        self.started = False
        self._group_topics_seen: dict[str, int] = {}
        #: The connections the HTTP API's forwarded requests share, per other node
        #: (server/http/peers.py, made on first use); closed by :meth:`close`.
        self.peer_pool: Closable | None = None

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Register, load the metadata, campaign, and start reconciling.

        Raises:
            EtcdError: the node id is taken by a live node, or etcd refused.
            EtcdUnavailableError: no etcd endpoint answered.
        """
        attach_node(self.broker, self)
        # Producer ids from this node's own range: unique across the cluster.
        self.broker.use_producer_id_range(self.node_id)
        self.broker.on_epoch_bump = self._record_epoch_bump  # its epoch bumps: to every node
        self.broker.cluster_topics = self._cluster_topics  # groups see the cluster's topics
        try:
            if self.replication is None:
                from tidewire.cluster.replication import ReplicaManager  # noqa: PLC0415

                # One made before the listeners opened (replication.hold_back): replaced.
                early = self.broker.replication
                manager = ReplicaManager(
                    self.broker,
                    self.node_id,
                    lag_max_ms=self.replica_lag_max_ms,
                    min_insync=self.min_insync_replicas,
                    propose_isr=self.propose_isr,
                    resign=self.resign,
                    advertise=(self.info.host, self.info.port),
                    connect=counting_connect(self.replica_connect or default_connect, self.stats),
                    lost_tails=self.lost_tails,
                )
                self.broker.replication = manager
                self.replication = manager
                # Before anything is served: a partition without a role yet is read only
                # below the high watermark this node knew last (cluster/hw_checkpoint.py).
                manager.start_checkpoints()
                if early is not None:
                    await early.close()
                self.scrubber = Scrubber(manager, self.scrub_bytes_per_s, stats=self.stats)
                self.scrubber.start()
            await self.lease.start()
            # Before registering: the controller must see the marks when it sees the node.
            # A process that died on the boot still running lost nothing it wrote.
            logs = self.broker.logs
            survived = await asyncio.to_thread(same_boot, logs.fs, logs.data_dir, kernel_boot_id())
            await self.lost_tails.load_and_mark(
                self.broker, clean=logs.was_clean or survived, id_file=TOPIC_ID_FILE
            )
            await self._register()
            await self.cache.load()
            self.cache.start()
            self.controller = self._controller()
            self.controller.start()
            # From now on the groups are served where their offsets partition is led.
            self.broker.groups.offsets.replicate(_OffsetsReplication(self.broker))
            # And security changes are made on the leader of __security, replicated.
            self.broker.security.replicate(ClusterSecurity(self))
            self.broker.streams.replicate(self.stream_owners)
            # Queues: definitions replicated, each durable queue served by its owner.
            self.queues = ClusterQueues(self)
            self.broker.queues.replicate(self.queues)
            # And this node's audit events go to its replicated audit log.
            if self.broker.audit is not None:
                self.broker.audit.replicate(self.audit, self.node_id)
        except BaseException:
            await self.close()
            raise
        self._dirty.set()
        self._task = asyncio.create_task(self._run(), name=f"cluster node {self.node_id}")
        self._task.add_done_callback(_log_failure)
        self.started = True
        log.info(
            "node %d registered as %s:%d in cluster %s",
            self.node_id,
            self.info.host,
            self.info.port,
            self.store.root,
        )

    async def _register(self) -> None:
        """Register on the lease. A node restarted right after a crash finds its id still
        held by its former lease until that expires: it waits up to a session timeout (and
        a second) before it gives up, so only a live twin is refused."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.session_timeout_s + 1
        while True:
            try:
                await self.store.register(self.info, self.lease.id)
                return
            except NodeIdTakenError:
                if loop.time() >= deadline:
                    raise
                log.info("node id %d still held by a lease; waiting for it to expire", self.node_id)
            await asyncio.sleep(REGISTER_BACKOFF_S[0])

    async def close(self) -> None:
        """Stop reconciling, stop the replicas, leave the election and the cluster (the
        lease is revoked: the others see this node gone at once)."""
        await self.audit.close()  # while it still leads its audit log
        self.dead_replicas.close()
        self.started = False
        await self.stream_owners.close()
        pool, self.peer_pool = self.peer_pool, None
        if pool is not None:
            await pool.close()
        if self._offsets_task is not None:
            self._offsets_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._offsets_task
            self._offsets_task = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.controller is not None:
            await self.controller.close()
        if self.scrubber is not None:
            await self.scrubber.close()
        if self.replication is not None:
            await self.replication.close()
        await self.cache.close()
        await self.lease.close()
        await self.etcd.close()
        self.broker.security.replicate(None)
        if self.queues is not None:
            self.broker.queues.replicate(None)
            await self.queues.close()
        self.broker.on_epoch_bump = None
        self.broker.cluster_topics = None
        detach_node(self.broker)

    def _controller(self) -> Controller:
        cache = self.cache

        def unclean(topic: str) -> bool:
            info = cache.topics.get(topic)
            return info is not None and info.config.get(UNCLEAN_KEY) == "true"

        controller = Controller(self.store, cache, self.node_id, self.lease, unclean=unclean)
        controller.on_written = self.stats.controller_wrote
        return controller

    def _changed(self, kind: str, key: str, value: object | None) -> None:
        if kind == "producer-epoch":  # another node's bump (or this one's): fenced here too
            assert isinstance(value, tuple)
            self.broker.fence_producer_epoch(*value)
            return
        self._dirty.set()

    async def _record_epoch_bump(self, producer_id: int, epoch: int) -> None:
        """Record an epoch bump this node answers in etcd, before the answer, so every node
        fences the older epochs (on a lease shared by the bumps of an hour, see
        :data:`EPOCH_LEASE_SHARED_S`). When etcd cannot be reached the bump is answered all
        the same (logged): it fences here, and on another leader once the new epoch has
        written there."""
        now = asyncio.get_running_loop().time()
        try:
            if self._epoch_lease is None or now - self._epoch_lease[1] >= EPOCH_LEASE_SHARED_S:
                ttl_s = -(-self.broker.config.producer_expiration_ms // 1000)
                lease = await self.etcd.grant(ttl_s + EPOCH_LEASE_SHARED_S)
                self._epoch_lease = (lease, now)
            await self.store.record_producer_epoch(producer_id, epoch, self._epoch_lease[0])
        except EtcdError as exc:
            self._epoch_lease = None  # a lease etcd lost (a restart from an old snapshot)
            log.warning(
                "producer id %d epoch %d: not recorded in etcd (other nodes fence the older "
                "epochs once the new one writes there): %s",
                producer_id,
                epoch,
                exc,
            )

    async def _run(self) -> None:
        while True:
            if self.lease.lost.is_set():
                await self._rejoin()
                continue
            self._dirty.clear()
            try:
                done = await self._reconcile()
            except Exception:  # logged, and tried again: the node must not stop following
                log.exception(
                    "node %d: reconcile pass failed; again in %.0f s", self.node_id, RETRY_S
                )
                done = False
            self._passed.set()
            lost = asyncio.ensure_future(self.lease.lost.wait())
            dirty = asyncio.ensure_future(self._dirty.wait())
            waits = {lost, dirty}
            timeout = None if done else RETRY_S
            if self.lease.stale.is_set() or self._stepped_down:
                timeout = STALE_CHECK_S  # followers checked, and etcd's return noticed
            else:
                waits.add(asyncio.ensure_future(self.lease.stale.wait()))
            try:
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
            self._check_stale()

    def _check_stale(self) -> None:
        """While the lease is stale, give up the partitions led here whose in-sync followers
        have all stopped fetching for a session timeout (the next pass makes them offline
        here, keeping the high watermark); once etcd answers again, take them up again."""
        if not self.lease.stale.is_set():
            if self._stepped_down:
                self._stepped_down.clear()
                self._dirty.set()
            return
        assert self.replication is not None
        now = self.replication.clock()
        for key, state in self.replication.led_states().items():
            followers = [state.followers[r] for r in state.isr if r in state.followers]
            if followers and all(now - f.fetched_at > self.session_timeout_s for f in followers):
                log.warning(
                    "partition %s/%d: etcd does not answer and no in-sync follower has fetched "
                    "for %d s: node %d stops leading it until etcd answers",
                    *key,
                    self.session_timeout_s,
                    self.node_id,
                )
                self._stepped_down.add(key)
                self._dirty.set()

    async def _rejoin(self) -> None:
        """The lease is lost: stop leading (the others presume this node gone), then register
        again on a new lease once etcd answers."""
        log.warning(
            "node %d lost its etcd lease: it stops leading its partitions and registers again",
            self.node_id,
        )
        assert self.replication is not None
        self.stats.lease_losses += 1
        self._stepped_down.clear()
        for key, role in sorted(self._applied.items()):
            if role[0] == "leader":
                self._offsets_role(key, leading=False)
                with contextlib.suppress(TidewireError):
                    await self.replication.stop_replica(*key, keep_high_watermark=True)
                del self._applied[key]
        if self.controller is not None:
            await self.controller.close()
        old = self.lease
        await old.close(revoke=False)
        delay = REGISTER_BACKOFF_S[0]
        while True:
            lease = Lease(self.etcd, ttl_s=self.session_timeout_s)
            try:
                # After an etcd restart the old lease may still be alive: it holds this
                # node's id, so it goes first.
                await self.etcd.revoke(old.id)
                await lease.start()
                await self.store.register(self.info, lease.id)
                break
            except EtcdError as exc:
                log.warning("node %d cannot register again yet: %s", self.node_id, exc)
                await lease.close()
                await asyncio.sleep(delay)
                delay = min(delay * 2, REGISTER_BACKOFF_S[1])
        self.lease = lease
        self.controller = self._controller()
        self.controller.start()
        self._dirty.set()
        log.info("node %d registered again", self.node_id)
        if self.queues is not None:  # the transient queues' records went with the old lease
            await self.queues.reclaim_transients()

    # --- reconcile ------------------------------------------------------------------------------

    async def _reconcile(self) -> bool:
        """One pass making the local replicas match the metadata; False when something is
        left for the next pass."""
        replication = self.replication
        assert replication is not None
        cache = self.cache
        topics = dict(cache.topics)
        done = True
        if not self._orphans_checked:
            self._orphans_checked = await self._delete_orphans(topics)
            done = done and self._orphans_checked
        # Topics deleted from etcd: their replicas stop, their logs go.
        for name in sorted(self._seen_topics - topics.keys()):
            for key in [k for k in self._applied if k[0] == name]:
                self._offsets_role(key, leading=False)
                await replication.stop_replica(*key)
                del self._applied[key]
            if self.broker.logs.partition_count(name):
                try:
                    await self.broker.delete_topic_async(name)
                except TidewireError as exc:
                    log.warning("topic %s deleted in etcd, not here yet: %s", name, exc)
                    done = False
                    continue
            self._seen_topics.discard(name)
            self._verified.pop(name, None)
        for name, info in sorted(topics.items()):
            checked = not info.topic_id or self._verified.get(name) == info.topic_id
            if not checked and not await self._check_incarnation(name, info):
                done = False
        self._seen_topics.update(topics)
        counts = self._cluster_topics()
        if counts != self._group_topics_seen:  # groups resolve against the cluster's topics
            self._group_topics_seen = counts
            self.broker._topics_changed()
        wanted: dict[tuple[str, int], PartitionState] = {
            key: state
            for key, (state, _) in cache.partitions().items()
            if self.node_id in state.replicas and key[0] in topics
        }
        # Replicas moved away from this node (its topic still there).
        for key in sorted(self._applied.keys() - wanted.keys()):
            self._offsets_role(key, leading=False)
            await replication.stop_replica(*key)
            del self._applied[key]
        # Their logs go (also of moves made while this node was down); settings follow etcd's.
        for name, info in sorted(topics.items()):
            if not await reassign.sync_local(self, name, info):
                done = False
        for key, state in sorted(wanted.items()):
            role = self._role_of(state)
            got = cache.partition(*key)
            if role and role[0] == "leader" and self.lost_tails.voids(key, got[1] if got else 0):
                role = ("offline", state.leader_epoch)  # named before its tail was lost
            if role and role[0] == "leader" and key in self._stepped_down:
                role = ("offline", state.leader_epoch)  # cut off from etcd and its followers
            if role is not None and role[0] == "leader":  # a changed min_insync is applied too
                role = (*role, self.min_insync_of(topics[key[0]]))
            if role is None:
                done = False  # the leader's address is not known yet
                continue
            if self._applied.get(key) == role:
                followed = replication.following(key) if role[0] == "follower" else None
                if followed is None or not followed.paused:
                    continue
                # Its leader refused the fetch (NotLeader: e.g. asked before it took the
                # lead): told again, the fetcher tries again. Retried each pass until it takes.
                done = False
            try:
                await self._ensure_log(key[0], key[1], topics[key[0]])
                # Before another role is taken (a follower's copy of the log may be cut); an
                # ISR change of the same leadership keeps the groups where they are.
                same_lead = _same_leadership(self._applied.get(key), role)
                if not same_lead:
                    self._offsets_role(key, leading=False)
                if role[0] == "leader":
                    await replication.become_leader(
                        key[0],
                        key[1],
                        epoch=state.leader_epoch,
                        replicas=state.replicas,
                        isr=state.isr,
                        min_insync=self.min_insync_of(topics[key[0]]),
                    )
                elif role[0] == "follower":
                    node = cache.nodes[state.leader]
                    await replication.become_follower(
                        key[0],
                        key[1],
                        epoch=state.leader_epoch,
                        leader=state.leader,
                        leader_address=(node.host, node.port),
                    )
                elif key in self._applied:  # offline: nobody leads, this node included
                    await replication.stop_replica(*key, keep_high_watermark=True)
            except (TidewireError, ValueError) as exc:  # ValueError: an epoch below the log's
                log.warning("partition %s/%d: cannot take its role %s yet: %s", *key, role[0], exc)
                done = False
                continue
            log.info("partition %s/%d: %s at epoch %d", *key, role[0], state.leader_epoch)
            self._applied[key] = role
            if not same_lead:
                self._offsets_role(key, leading=role[0] == "leader")
        if not await include_new_nodes(self):  # nodes that joined get the security state
            done = False
        if not await include_queue_definitions(self):  # and the queue definitions
            done = False
        if not await self.audit.reconcile():  # audit logs led by their nodes, 3 copies
            done = False
        return done

    def _cluster_topics(self) -> dict[str, int]:
        """The cluster's topics (internal ones left out) and their partition counts: what
        the broker's consumer groups resolve subscriptions against here."""
        return {
            name: info.partitions
            for name, info in self.cache.topics.items()
            if not is_internal_topic(name)
        }

    async def _delete_orphans(self, topics: dict[str, TopicInfo]) -> bool:
        """At the first pass after the metadata is loaded: delete the logs of topics that
        etcd does not know, made in this cluster (they carry a topic id) and deleted while
        this node was away, so they are not kept or served for ever. A topic's logs without
        an id (made by a single node, before this data directory joined a cluster) and
        internal topics stay. False: a deletion failed (tried again at the next pass)."""
        fs = self.broker.logs.fs
        ok = True
        for name, parts in self.broker.logs.topics().items():
            if name in topics or is_internal_topic(name) or name.startswith("__"):
                continue
            data_dir = self.broker.logs.data_dir
            try:
                ids = [p for p in parts if fs.exists(f"{data_dir}/{name}-{p}/{TOPIC_ID_FILE}")]
            except OSError as exc:
                log.warning("topic %s: not checked for deletion: %s", name, exc)
                ok = False
                continue
            if not ids:
                continue
            log.warning(
                "topic %s: deleting its logs here (partitions %s): the cluster does not know "
                "the topic (deleted while node %d was away)",
                name,
                ",".join(map(str, parts)),
                self.node_id,
            )
            try:
                await self.broker.delete_topic_async(name)
            except TidewireError as exc:
                log.warning("topic %s: its logs are not deleted yet: %s", name, exc)
                ok = False
        return ok

    def _offsets_role(self, key: tuple[str, int], *, leading: bool) -> None:
        """Tell the broker's groups that this node now leads a partition of the offsets
        topic (they load it and serve its groups) or no longer does (they forget them); the
        same for the streams of a partition of ``__streams`` and for a durable queue."""
        if key[0] == STREAMS_TOPIC:
            streams_role(self, key[1], leading=leading)
            return
        if (queue := queue_of(key[0])) is not None:  # a durable queue's owner serves it
            self.broker.queues.cluster_role(queue, leading=leading)
            return
        if key[0] != OFFSETS_TOPIC:
            return
        if leading:
            self.broker.groups.take_over(key[1])
        else:
            self.broker.groups.give_up(key[1])

    def _role_of(self, state: PartitionState) -> _Role | None:
        if state.leader == NO_LEADER:
            return ("offline", state.leader_epoch)
        if state.leader == self.node_id:  # the ISR too: the controller may shrink it
            return ("leader", state.leader_epoch, state.replicas, state.isr)
        node = self.cache.nodes.get(state.leader)
        if node is None:
            return None
        return ("follower", state.leader_epoch, state.leader, node.host, node.port)

    def _local_logs(self, name: str, info: TopicInfo) -> list[PartitionLog]:
        """This node's open logs of topic ``name``, among etcd's partitions of it (looked up
        one by one: the broker may hold thousands of other logs)."""
        logs = self.broker.logs.logs
        return [plog for p in range(info.partitions) if (plog := logs.get((name, p))) is not None]

    async def _check_incarnation(self, name: str, info: TopicInfo) -> bool:
        """Whether the local logs of topic ``name`` (if any) are of the incarnation etcd
        names; the logs of an earlier topic of that name (deleted and made again while this
        node was away) are deleted, so that this node copies the new one from its leader
        instead of mixing the two. A log without an id file (made before topic ids) is taken
        as this incarnation's. False: something is left for the next pass."""
        if name == SECURITY_TOPIC:  # a node's own security state is never adopted
            return await check_security_incarnation(self, info)
        if name == QUEUE_DEFINITIONS_TOPIC:  # nor its own queue definitions
            return await check_definitions_incarnation(self, info)
        fs = self.broker.logs.fs
        held: set[str] = set()
        for plog in self._local_logs(name, info):
            path = f"{plog.directory}/{TOPIC_ID_FILE}"
            try:
                if fs.exists(path):
                    held.add(fs.read_file(path).decode().strip())
            except OSError as exc:
                log.warning("%s: topic id not checked: %s", plog.directory, exc)
                return False
        if held - {"", info.topic_id}:
            log.warning(
                "topic %s: the logs here are of an earlier topic of that name (deleted and "
                "created again while this node was away); deleting them to copy the new one",
                name,
            )
            assert self.replication is not None
            for key in [k for k in self._applied if k[0] == name]:
                await self.replication.stop_replica(*key)
                del self._applied[key]
            try:
                await self.broker.delete_topic_async(name)
            except TidewireError as exc:
                log.warning("topic %s: the earlier logs are not deleted yet: %s", name, exc)
                return False
        try:
            await self._write_ids(name, info)
        except OSError as exc:
            log.warning("topic %s: topic id not written: %s", name, exc)
            return False
        self._verified[name] = info.topic_id
        return True

    async def _write_ids(self, name: str, info: TopicInfo) -> None:
        """Write the incarnation id into each local log of ``name`` that has none."""
        fs = self.broker.logs.fs
        for plog in self._local_logs(name, info):
            path = f"{plog.directory}/{TOPIC_ID_FILE}"
            if not fs.exists(path):
                await asyncio.to_thread(write_atomic, fs, path, info.topic_id.encode())

    async def _ensure_log(self, topic: str, partition: int, info: TopicInfo) -> None:
        """Make the local log of a partition this node replicates, with its topic's
        settings and incarnation id, unless it exists."""
        logs = self.broker.logs
        if (topic, partition) in logs.logs or (topic, partition) in logs.offline:
            return
        try:
            await self._make_log(topic, partition, info)
        finally:
            if info.topic_id:
                await self._write_ids(topic, info)

    async def _make_log(self, topic: str, partition: int, info: TopicInfo) -> None:
        logs = self.broker.logs
        cfg = config_of(info, self.broker.config.log)
        if is_internal_topic(topic):  # made as the broker makes its own: by the log manager
            await logs.create_topic_async(topic, range(partition, partition + 1), cfg)
            return
        if not logs.partition_count(topic) and all(
            self.node_id in s.replicas
            for p in range(info.partitions)
            if (got := self.cache.partition(topic, p)) is not None
            for s in (got[0],)
        ):
            # Every partition is replicated here: the topic is made as a single node makes it.
            await self.broker.create_topic_async(topic, info.partitions, cfg)
            return
        await logs.create_topic_async(topic, range(partition, partition + 1), cfg)

    async def wait_reconciled(self, predicate: Callable[[], bool], timeout_s: float) -> None:
        """Until ``predicate()`` holds after a reconcile pass."""
        async with asyncio.timeout(timeout_s):
            while True:
                self._passed.clear()
                self._dirty.set()
                await self._passed.wait()
                if predicate():
                    return

    # --- ISR changes by a leader ----------------------------------------------------------------

    async def _led_at(
        self, topic: str, partition: int, epoch: int
    ) -> tuple[PartitionState, int] | None:
        """The partition's state as etcd holds it and its version, if this node still leads
        it at ``epoch`` and holds its lease (None otherwise).

        Raises:
            EtcdError: etcd did not answer.
        """
        if self.lease.lost.is_set():
            return None
        kv = await self.etcd.get(self.store.partition_key(topic, partition))
        if kv is None:
            return None
        state = msgspec.json.decode(kv.value, type=PartitionState)
        if state.leader != self.node_id or state.leader_epoch != epoch:
            return None
        return state, kv.mod_revision

    async def propose_isr(
        self, topic: str, partition: int, epoch: int, isr: tuple[int, ...]
    ) -> bool:
        """Replace the ISR of a partition this node leads at ``epoch``: a compare-and-swap
        on the version read, refused when the partition changed meanwhile or is no longer
        this node's at that epoch. Returns whether etcd took it and this node's copy of the
        metadata holds nothing later (never raises: an etcd that does not answer is a
        refusal; the leader proposes again later)."""
        try:
            got = await self._led_at(topic, partition, epoch)
            if got is None:
                return False
            state, version = got
            if not set(isr) <= set(state.replicas) or self.node_id not in isr:
                log.warning(
                    "partition %s/%d: ISR %s refused: not its replicas", topic, partition, isr
                )
                return False
            new = PartitionState(state.replicas, state.leader, epoch, tuple(isr))
            ok = await self.store.set_partition(topic, partition, new, version)
        except EtcdError as exc:
            log.warning("partition %s/%d: ISR %s not proposed: %s", topic, partition, isr, exc)
            return False
        if ok:
            self.stats.isr_changed(state.isr, tuple(isr))
            log.info("partition %s/%d: ISR now %s", topic, partition, list(isr))
            seen = self.cache.partition(topic, partition)
            if seen is not None and seen[1] > version and seen[0] != new:
                # etcd's answer came after the watch brought a later change (the controller
                # taking a node out again): the copy holds that one, and the reconcile pass
                # applies it (or did). Held now, this ISR would take back what that change
                # removed, unchecked, until the lag check proposed it out again.
                return False
            # The replica manager holds this ISR now (it commits it on this answer): so does
            # the role applied, else a later change of etcd's back to the role applied before
            # (the controller taking out a node this leader had just taken in) would look
            # like no change, and the leader would go on counting an ISR etcd does not hold
            # (never proposing it again: it holds it already), a follower left out for good.
            key = (topic, partition)
            applied = self._applied.get(key)
            if applied is not None and applied[:2] == ("leader", epoch) and len(applied) > 3:
                self._applied[key] = (*applied[:3], tuple(isr), *applied[4:])
        return ok

    async def resign(self, topic: str, partition: int, epoch: int) -> bool:
        """Hand a partition this node leads at ``epoch`` to the first other in-sync replica
        that is alive, at the next epoch, and leave its ISR (this node's log has a damaged
        range, which that replica holds intact): a compare-and-swap like
        :meth:`propose_isr`. Returns whether etcd took it (False: no such replica, the
        partition changed, or etcd did not answer)."""
        try:
            got = await self._led_at(topic, partition, epoch)
            if got is None:
                return False
            state, version = got
            live = set(self.cache.nodes)
            isr = tuple(r for r in state.isr if r != self.node_id)
            heirs = [r for r in state.replicas if r in isr and r in live]
            if not heirs:
                return False
            new = PartitionState(state.replicas, heirs[0], epoch + 1, isr)
            ok = await self.store.set_partition(topic, partition, new, version)
        except EtcdError as exc:
            log.warning("partition %s/%d: not handed over: %s", topic, partition, exc)
            return False
        if ok:
            log.info(
                "partition %s/%d: handed to node %d at epoch %d (ISR %s)",
                topic,
                partition,
                heirs[0],
                epoch + 1,
                list(isr),
            )
        return ok

    # --- administration -------------------------------------------------------------------------

    def _check_started(self) -> None:
        if not self.started:
            raise RequestTimedOutError(
                f"node {self.node_id} is joining or leaving its cluster; try again in a "
                "moment (or another node)"
            )

    async def create_topic(
        self,
        name: str,
        partitions: int | None,
        config: LogConfig,
        replication_factor: int | None = None,
        *,
        min_insync_replicas: int | None = None,
        unclean_leader_election: bool | None = None,
    ) -> int:
        """Create a topic in the cluster: replicas placed over the live nodes, the first of
        each set leading at epoch 0, all in sync. Answered once this node's copy has it (and
        its local replicas exist). ``min_insync_replicas`` (None: this node's
        ``--min-insync-replicas``, at most the replication factor) and
        ``unclean_leader_election`` are kept with the topic in etcd: every leader of its
        partitions applies them.

        Returns:
            The partition count.

        Raises:
            InvalidTopicError: a bad name or partition count, or more replicas than live nodes.
            InvalidConfigError: ``min_insync_replicas`` outside 1..replication factor.
            InternalTopicError: a name reserved for the broker.
            TopicExistsError: it exists.
            RequestTimedOutError: etcd did not answer, or this node did not follow in time.
        """
        self._check_started()
        try:
            validate_topic_name(name)
        except InvalidConfigError as exc:
            raise InvalidTopicError(exc.message) from None
        if is_internal_topic(name) or name.startswith("__"):
            raise InternalTopicError(
                f"topic {name!r} cannot be created: names beginning with '__' are reserved "
                "for the broker's internal topics"
            )
        n = self.broker.config.default_partitions if partitions is None else partitions
        if not 1 <= n <= MAX_PARTITIONS:
            raise InvalidTopicError(f"partitions={n} must be within 1..{MAX_PARTITIONS:,}")
        live = sorted(self.cache.nodes)
        rf = (
            min(self.default_replication_factor, len(live))
            if replication_factor is None
            else replication_factor
        )
        try:
            placement = assign(n, rf, live, random.randrange(max(1, len(live))))
        except ValueError as exc:
            raise InvalidTopicError(str(exc)) from None
        strings = config_to_strings(config)
        if min_insync_replicas is not None:
            if not 1 <= min_insync_replicas <= rf:
                raise InvalidConfigError(
                    f"min_insync_replicas={min_insync_replicas} must be within 1..{rf} (the "
                    "replication factor): acks=all could never be answered"
                )
            strings[MIN_INSYNC_KEY] = str(min_insync_replicas)
        if unclean_leader_election is not None:
            strings[UNCLEAN_KEY] = "true" if unclean_leader_election else "false"
        topic = TopicInfo(name, n, rf, strings, uuid.uuid4().hex)
        try:
            created = await self.store.create_topic(topic, placement, None)
        except EtcdError as exc:
            raise RequestTimedOutError(f"topic {name!r} not created: {exc}") from None
        if not created:
            raise TopicExistsError(f"topic {name!r} exists already")
        log.info("created topic %s: %d partition(s), replicas %s", name, n, placement)
        here = [(name, p) for p, replicas in enumerate(placement) if self.node_id in replicas]
        await self._await_local(
            f"topic {name!r} was created in the cluster, but node {self.node_id} did not",
            lambda: all(k in self._applied for k in here) and name in self._seen_topics,
        )
        return n

    async def delete_topic(self, name: str) -> None:
        """Delete a topic from the cluster; answered once this node's copy and logs are rid
        of it (the other nodes delete theirs as their copies see it).

        Raises:
            UnknownTopicError, InvalidTopicError (an internal topic), RequestTimedOutError.
        """
        self._check_started()
        if is_internal_topic(name):
            raise InternalTopicError(f"topic {name!r} is internal to the broker")
        try:
            deleted = await self.store.delete_topic(name, None)
        except EtcdError as exc:
            raise RequestTimedOutError(f"topic {name!r} not deleted: {exc}") from None
        if not deleted:
            raise UnknownTopicError(f"topic {name!r} does not exist")
        log.info("deleted topic %s", name)
        await self._await_local(
            f"topic {name!r} was deleted in the cluster, but node {self.node_id} did not",
            lambda: name not in self._seen_topics and not self.broker.logs.partition_count(name),
        )

    async def ensure_offsets_topic(self) -> None:
        """Create ``__consumer_offsets`` through etcd unless it exists: the broker's
        partition count and settings (``fsync=always``, no retention), replicated on
        ``min(default_replication_factor, live nodes)`` nodes. Made on first use rather than
        at start, so that the nodes of a cluster being started are all there to hold it.
        Several nodes may try at once: etcd's compare-and-swap keeps the first.

        Raises:
            RequestTimedOutError: etcd did not answer.
        """
        if OFFSETS_TOPIC in self.cache.topics:
            return
        live = sorted(self.cache.nodes)
        if not live:
            return
        rf = min(self.default_replication_factor, len(live))
        placement = assign(OFFSETS_PARTITIONS, rf, live, random.randrange(len(live)))
        topic = TopicInfo(
            OFFSETS_TOPIC, OFFSETS_PARTITIONS, rf, config_to_strings(internal_config())
        )
        try:
            created = await self.store.create_topic(topic, placement, None)
        except EtcdError as exc:
            raise RequestTimedOutError(f"{OFFSETS_TOPIC} not created: {exc}") from None
        if created:
            log.info("created %s: replicas %s", OFFSETS_TOPIC, placement)

    def _offsets_topic_soon(self) -> None:
        """Start :meth:`ensure_offsets_topic` in the background unless it runs already."""
        if self._offsets_task is None or self._offsets_task.done():
            self._offsets_task = asyncio.create_task(
                self.ensure_offsets_topic(), name=f"node {self.node_id}: {OFFSETS_TOPIC}"
            )
            self._offsets_task.add_done_callback(_log_failure)

    async def _await_local(self, what: str, predicate: Callable[[], bool]) -> None:
        try:
            await self.wait_reconciled(predicate, ADMIN_WAIT_S)
        except TimeoutError:
            raise RequestTimedOutError(f"{what} within {ADMIN_WAIT_S:.0f} s") from None

    # --- metadata -------------------------------------------------------------------------------

    def min_insync_of(self, info: TopicInfo) -> int:
        """The in-sync replicas acks=all needs in ``info``'s partitions: the topic's own
        setting, else this node's ``--min-insync-replicas`` (at most the replication factor,
        so that a topic of fewer replicas than the default stays writable)."""
        own = info.config.get(MIN_INSYNC_KEY)
        if own is not None:
            return int(own)
        return max(1, min(self.min_insync_replicas, info.replication_factor))

    def live_nodes(self) -> list[NodeInfo]:
        """The nodes registered now (this one included), by id."""
        return [n for _, n in sorted(self.cache.nodes.items())]

    def metadata(
        self,
        names: list[str] | None,
        visible: Callable[[list[str]], list[str]],
        *,
        auto_create: bool = False,
    ) -> MetadataResponse:
        """The METADATA answer: the topics (``None``: every one ``visible`` leaves), each
        partition's leader, epoch, replicas and ISR (and its offsets where it is replicated
        here), every live node and the controller.

        Raises:
            RequestTimedOutError: the node is still joining (its copy of the metadata is not
                loaded yet: it would answer that no topic exists); retriable, and a client
                asks another node.
        """
        self._check_started()
        cache = self.cache
        if names is None:  # the broker's own topics are listed only by name, as on one node
            names = visible(sorted(t for t in cache.topics if not is_internal_topic(t)))
        topics = []
        for name in names:
            info = cache.topics.get(name)
            if info is None and name == OFFSETS_TOPIC and self.started:
                # A client looks for a group's coordinator: the topic is made on first use.
                self._offsets_topic_soon()
            if info is None and name == STREAMS_TOPIC and self.started:
                self.stream_owners.topic_soon()  # a client looks for a stream's owner
            if info is None and self.queues is not None:  # a transient queue's owner
                transient = self.queues.transient_metadata(name)
                if transient is not None:
                    topics.append(transient)
                    continue
            if info is None:
                reason = " (in a cluster, create it first: tidewire topic create)" * auto_create
                exc = UnknownTopicError(f"topic {name!r} does not exist{reason}")
                topics.append(
                    TopicDescription(
                        name=name,
                        partitions=[],
                        config=TopicConfig(),
                        error_code=exc.code,
                        error_message=exc.message,
                    )
                )
                continue
            parts = [self._partition_info(name, p) for p in range(info.partitions)]
            cfg = config_of(info, self.broker.config.log)
            topics.append(
                TopicDescription(
                    name=name,
                    partitions=parts,
                    replication_factor=info.replication_factor,
                    min_insync_replicas=self.min_insync_of(info),
                    unclean_leader_election=info.config.get(UNCLEAN_KEY) == "true",
                    config=TopicConfig(
                        retention_ms=cfg.retention_ms,
                        retention_bytes=cfg.retention_bytes,
                        segment_bytes=cfg.segment_bytes,
                        segment_ms=cfg.segment_ms,
                        fsync=str(cfg.fsync),
                        flush_interval_ms=cfg.flush_interval_ms,
                        max_message_bytes=cfg.max_batch_bytes,
                    ),
                )
            )
        return MetadataResponse(
            broker_id=self.node_id,
            host=self.info.host,
            port=self.info.port,
            topics=topics,
            nodes=[
                NodeAddress(node_id=n.node_id, host=n.host, port=n.port)
                for _, n in sorted(cache.nodes.items())
            ],
            controller=cache.controller,
        )

    def _partition_info(self, topic: str, p: int) -> PartitionInfo:
        got = self.cache.partition(topic, p)
        state = got[0] if got is not None else PartitionState((), NO_LEADER, -1, ())
        logs = self.broker.logs
        plog = logs.logs.get((topic, p))
        if plog is None:
            offline = logs.offline.get((topic, p), "")
            return PartitionInfo(
                partition=p,
                log_start_offset=-1,
                log_end_offset=-1,
                high_watermark=-1,
                size_bytes=0,
                offline=offline,
                leader=state.leader,
                leader_epoch=state.leader_epoch,
                replicas=list(state.replicas),
                isr=list(state.isr),
            )
        try:
            hw = self.broker.high_watermark(topic, p)
        except TidewireError:
            hw = -1  # not led here: the leader knows it
        return PartitionInfo(
            partition=p,
            log_start_offset=plog.log_start_offset,
            log_end_offset=plog.log_end_offset,
            high_watermark=hw,
            size_bytes=plog.size_bytes,
            damage=[DamageInfo.of(d) for d in plog.damage],
            leader=state.leader,
            leader_epoch=state.leader_epoch,
            replicas=list(state.replicas),
            isr=list(state.isr),
        )


def _same_leadership(before: _Role | None, after: _Role) -> bool:
    """Whether both roles lead at the same epoch (only the replicas or the ISR changed)."""
    return before is not None and before[0] == after[0] == "leader" and before[1] == after[1]


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("cluster node task failed", exc_info=task.exception())
