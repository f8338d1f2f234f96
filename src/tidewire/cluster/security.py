"""Users, keys, ACLs and quotas of a cluster: ``__security`` as a replicated partition.

On a single node the security store (:class:`~tidewire.security.store.SecurityStore`) is
the node's own log ``__security``. In a cluster that log is one partition of a replicated
internal topic, kept in etcd like ``__consumer_offsets``:

- **Made by the first change.** The first security change made on any node (a principal,
  a key, an ACL, a quota) creates the topic through etcd when it does not exist yet, on
  every live node (each node authenticates, so each holds a copy; the log is small), the
  node that made the change first, so that it leads at epoch 0 and its own state (its
  bootstrap admin, the grant it was just asked for) becomes the cluster's. The id of that
  incarnation is written into the node's local log before the compare-and-swap, so its
  reconcile pass adopts the log.
- **Every other node's own state is replaced.** A local ``__security`` that is not of the
  cluster's incarnation (no id file, or another id: the node's own bootstrap admin, or
  another cluster's) is deleted and copied from the leader instead, because two logs that
  were written apart cannot be merged record by record. The node logs it.
- **Changes are made on the leader.** A change asked of another node is answered
  ``NotLeaderError`` naming the leader (the client asks it there; the HTTP API redirects
  there); the leader stores it (refused below ``min_insync_replicas``), applies it, and
  answers once every in-sync replica holds it.
- **A node that joins later** becomes a replica: the leader moves the topic onto every
  live node that is not one yet (:func:`include_new_nodes`, a reassignment). Until its copy
  is made, such a node holds no security state at all (its own is deleted as above), so it
  authenticates nobody: it fails closed.
- **A node gone for good** (not registered for :data:`DEAD_NODE_S`, as the leader saw it:
  :class:`DeadReplicas`) stops being a replica, in the same move, so the topic does not keep
  a copy on a node that never returns (in its ISR it would hold nothing back, but it would
  count among the replicas for ever). A node that returns later is a new one to the topic:
  it is moved back on as above.
- **Every replica applies what it copies** (``Broker.replica_appended``), and replays its
  log when the log is cut (``Broker.replica_truncated``), so a key made on one node
  authenticates on all of them and an ACL removed on one refuses on all.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from tidewire.cluster.controller import assign
from tidewire.cluster.etcd import EtcdError
from tidewire.cluster.metadata import TopicInfo
from tidewire.errors import (
    NotEnoughReplicasError,
    NotLeaderError,
    RequestTimedOutError,
    TidewireError,
)
from tidewire.security._logs import SECURITY_TOPIC, open_log, security_config
from tidewire.storage import PartitionLog
from tidewire.storage.fs import write_atomic

if TYPE_CHECKING:
    from tidewire.cluster.node import ClusterNode

__all__ = [
    "DEAD_NODE_S",
    "ClusterSecurity",
    "DeadReplicas",
    "check_security_incarnation",
    "include_new_nodes",
]

log = logging.getLogger("tidewire.cluster.security")

_KEY = (SECURITY_TOPIC, 0)

#: A replica's node not registered for this long (seconds; as the leader of the topic saw
#: it) is taken off ``__security`` and the audit logs: long past any restart or rolling
#: upgrade (a few session timeouts), short enough not to carry a dead node for days.
DEAD_NODE_S = 600.0


class DeadReplicas:
    """Since when each node named as a replica of ``__security``, ``__queue_definitions`` or
    an audit log has not been registered, as this node (the leader of such a topic) saw it;
    which of them have been gone for :attr:`after_s`. Kept in memory: a new leader counts
    from when it took over. A reconcile pass is asked for when the next one is due."""

    def __init__(self, node: ClusterNode, after_s: float = DEAD_NODE_S) -> None:
        self._node = node
        self.after_s = after_s
        self._since: dict[int, float] = {}
        self._timer: asyncio.TimerHandle | None = None

    def dead(self, replicas: tuple[int, ...]) -> set[int]:
        """Those of ``replicas`` not registered for :attr:`after_s` (seconds) or more."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        live = self._node.cache.nodes
        for r in list(self._since):
            if r in live:
                del self._since[r]
        out = set()
        due = []
        for r in replicas:
            if r in live:
                continue
            since = self._since.setdefault(r, now)
            if now - since >= self.after_s:
                out.add(r)
            else:
                due.append(since + self.after_s)
        if due:  # a pass then, even if nothing else changes
            when = min(due)
            if self._timer is None or self._timer.when() > when or self._timer.cancelled():
                if self._timer is not None:
                    self._timer.cancel()
                self._timer = loop.call_at(when, self._node._dirty.set)
        return out

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class ClusterSecurity:
    """How the security store of ``node``'s broker writes in the cluster (see the module
    docstring); a :class:`~tidewire.security.store.SecurityReplication`."""

    def __init__(self, node: ClusterNode) -> None:
        self._node = node

    async def leader_log(self) -> PartitionLog:
        await check_led_here(
            self._node,
            SECURITY_TOPIC,
            self.ensure_topic,
            "security changes (principals, keys, ACLs, quotas) are made",
        )
        return self._node.broker.logs.get_log(*_KEY)

    async def wait_replicated(self, end: int) -> None:
        broker = self._node.broker
        rep = broker.replication
        if rep is None:
            raise NotLeaderError(f"{SECURITY_TOPIC} is not led here")
        broker._wake(*_KEY)  # followers waiting in a fetch take it at once
        await rep.wait_replicated(SECURITY_TOPIC, 0, end, rep.ack_timeout_s)

    async def ensure_topic(self) -> None:
        """Create ``__security`` through etcd, this node first in its replicas (its leader at
        epoch 0) and its local log adopted as the cluster's; another node that got there
        first wins the compare-and-swap, and this node's log is then replaced by a copy.

        Raises:
            RequestTimedOutError: etcd did not answer.
        """
        node = self._node
        live = sorted(node.cache.nodes)
        if node.node_id not in live:
            raise RequestTimedOutError(f"node {node.node_id} is not registered in its cluster")
        rf = len(live)  # each node authenticates: each holds a copy
        first = live.index(node.node_id)
        (replicas,) = assign(1, rf, live, first)
        try:  # made meanwhile (this node's copy of the metadata lags): nothing to do here
            if await node.etcd.get(node.store.topic_key(SECURITY_TOPIC)) is not None:
                return
        except EtcdError as exc:
            raise RequestTimedOutError(f"{SECURITY_TOPIC} not created: {exc}") from None
        topic_id = uuid.uuid4().hex
        cfg = security_config()
        plog = open_log(node.broker.logs, SECURITY_TOPIC, cfg)
        from tidewire.cluster.node import TOPIC_ID_FILE, config_to_strings  # noqa: PLC0415

        fs = node.broker.logs.fs
        await asyncio.to_thread(
            write_atomic, fs, f"{plog.directory}/{TOPIC_ID_FILE}", topic_id.encode()
        )
        info = TopicInfo(SECURITY_TOPIC, 1, rf, config_to_strings(cfg), topic_id)
        try:
            created = await node.store.create_topic(info, [replicas], None)
        except EtcdError as exc:
            raise RequestTimedOutError(f"{SECURITY_TOPIC} not created: {exc}") from None
        if created:
            log.info(
                "created %s: replicas %s; the security state of node %d is the cluster's",
                SECURITY_TOPIC,
                list(replicas),
                node.node_id,
            )


async def check_led_here(
    node: ClusterNode, topic: str, ensure: Callable[[], Awaitable[None]], changes: str
) -> None:
    """Before a change to ``topic`` (one partition, changed on its leader only:
    ``__security``, ``__queue_definitions``): made through etcd by ``ensure`` when the
    cluster has no such topic yet; refused unless this node leads it (``changes`` says what
    is made there, in the error) and holds ``min_insync_replicas`` in sync.

    Raises:
        NotLeaderError: another node leads it (named).
        NotEnoughReplicasError: too few in-sync replicas; nothing is stored.
        RequestTimedOutError: this node does not replicate yet, or etcd did not answer.
    """
    node._check_started()
    if topic not in node.cache.topics:
        await ensure()
    rep = node.broker.replication
    if rep is None:
        raise RequestTimedOutError(f"node {node.node_id} does not replicate yet")
    key = (topic, 0)
    try:
        leader = rep.check_leader(*key)
    except NotLeaderError:
        # Just created here, or the leadership is moving: let the reconcile pass catch up
        # with etcd once, then answer with what holds.
        await node._await_local(
            f"{topic} is in the cluster, but node {node.node_id} has no role for it",
            lambda: key in node._applied,
        )
        try:
            leader = rep.check_leader(*key)
        except NotLeaderError as exc:
            raise NotLeaderError(
                f"{changes} on the leader of {topic}: {exc.message}",
                leader_id=exc.leader_id,
                leader_host=exc.leader_host,
                leader_port=exc.leader_port,
            ) from None
    if not leader.can_append_acks_all():
        raise NotEnoughReplicasError(
            f"{topic}: {len(leader.isr)} in-sync replica(s) {sorted(leader.isr)}, "
            f"min_insync_replicas is {leader.min_insync}; the change was not stored"
        )


async def include_new_nodes(node: ClusterNode) -> bool:
    """On the leader of ``__security``: keep it on every live node (see
    :func:`include_every_node`), so that every node holds the security state and
    authenticates. False: to be tried again at the next pass."""
    return await include_every_node(node, SECURITY_TOPIC, "every node holds the security state")


async def include_every_node(node: ClusterNode, topic: str, purpose: str) -> bool:
    """On the leader of ``topic`` (one partition, a replica on every node: ``__security``,
    ``__queue_definitions``): start moving it onto every live node that is not a replica
    yet (one that joined after it was made) and off the replicas whose nodes have been gone
    for :data:`DEAD_NODE_S` (:class:`DeadReplicas`): a reassignment (the controller adds
    the replicas, they copy the log and join the ISR; :mod:`tidewire.cluster.reassign`).
    ``purpose`` says why, in the log. False: to be tried again at the next pass (etcd did
    not answer, or the topic changed meanwhile).
    """
    key = (topic, 0)
    got = node.cache.partition(*key)
    if got is None or topic not in node.cache.topics:
        return True
    state = got[0]
    if state.leader != node.node_id or key in node.cache.reassignments:
        return True
    missing = sorted(set(node.cache.nodes) - set(state.replicas))
    dead = node.dead_replicas.dead(state.replicas)
    if not missing and not dead:
        return True
    from tidewire.cluster.reassign import _read_topic  # noqa: PLC0415 (imports node)

    target = (*(r for r in state.replicas if r not in dead), *missing)
    try:
        _, version = await _read_topic(node, topic)
        rev = await node.store.start_reassignments(topic, version, {0: target}, {0: state.replicas})
    except (EtcdError, TidewireError) as exc:
        log.warning("%s not moved onto nodes %s yet: %s", topic, missing, exc)
        return False
    if rev is None:
        return False
    log.info(
        "%s: replicas %s -> %s (%s%s)",
        topic,
        list(state.replicas),
        list(target),
        purpose,
        f"; nodes {sorted(dead)} gone for {node.dead_replicas.after_s:.0f} s" if dead else "",
    )
    return True


async def check_security_incarnation(node: ClusterNode, info: TopicInfo) -> bool:
    """The incarnation check of ``__security`` (see the module docstring): a local log of
    another incarnation, or with no id at all, is this node's own state and is replaced by a
    copy of the cluster's. False: something is left for the next pass."""
    return await replace_own_copy(
        node,
        SECURITY_TOPIC,
        info,
        "the security state here (principals, keys, ACLs, quotas)",
        node.broker.security.reload,
    )


async def replace_own_copy(
    node: ClusterNode, topic: str, info: TopicInfo, what: str, reload: Callable[[], None]
) -> bool:
    """For a topic of one partition on every node whose state each node applies
    (``__security``, ``__queue_definitions``): a local log that is not of the cluster's
    incarnation ``info`` (no id file, or another id: the node's own state from before it
    joined, or another cluster's) is deleted, to be copied from the leader instead (two logs
    written apart cannot be merged record by record), and ``reload`` is called for the state
    built from it. ``what`` names that state, in the log. False: something is left for the
    next pass."""
    from tidewire.cluster.node import TOPIC_ID_FILE  # noqa: PLC0415

    key = (topic, 0)
    logs = node.broker.logs
    plog = logs.logs.get(key)
    if plog is not None:
        path = f"{plog.directory}/{TOPIC_ID_FILE}"
        try:
            held = logs.fs.read_file(path).decode().strip() if logs.fs.exists(path) else ""
        except OSError as exc:
            log.warning("%s: topic id not checked: %s", plog.directory, exc)
            return False
        if held != info.topic_id:
            log.warning(
                "node %d: %s (%d record(s)) is not the cluster's; it is deleted and copied "
                "from the leader of %s instead",
                node.node_id,
                what,
                plog.log_end_offset - plog.log_start_offset,
                topic,
            )
            if key in node._applied and node.replication is not None:
                await node.replication.stop_replica(*key)
                del node._applied[key]
            try:
                await logs.delete_topic_async(topic)
            except TidewireError as exc:
                log.warning("%s: the local log is not deleted yet: %s", topic, exc)
                return False
            finally:
                reload()
    node._verified[topic] = info.topic_id
    return True
