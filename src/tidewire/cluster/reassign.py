"""Moving partitions between nodes, and changing a cluster's topic, through etcd.

A reassignment goes Kafka's way (KIP-455), each step a compare-and-swap in etcd:

1. an operator's request writes the partition's target replica set under
   ``reassign/<topic>/<partition>`` (:func:`reassign`; refused while one is under way);
2. the controller (:func:`reconcile_reassignments`, called from its reconcile pass, fenced by
   its election) adds the new replicas to the replica set: target first, then the ones
   leaving. The new replicas make their logs and fetch from the leader, which takes them into
   the ISR once they have caught up;
3. once every target replica is in the ISR, the controller writes the final state in one
   transaction with the end of the reassignment: the replica set is the target, the ISR what
   of it was in sync, and, when the leader is not in the target, the first in-sync target
   replica leads in the next leader epoch (the old leader stops at once: it is no replica);
4. a node that is no replica of a partition any more stops it and deletes its log
   (:func:`sync_local`, from the node's reconcile pass).

A move under way can be cancelled (:func:`cancel`), the way KIP-455 does: the partition goes
back to the replica set it had when the move started (kept with the target in etcd), the
replicas it was adding removed (they stop and delete their logs, step 4), its ISR what of
that set is in sync, in one transaction with the end of the move.

Nothing acknowledged is lost: a replica leaves only after every target replica holds what the
ISR holds, and a new leader comes from the ISR.

Of the broker's internal topics, only ``__consumer_offsets`` is moved on request (as Kafka
allows): its partitions are logs like any other, and a group's coordinator is the leader of
its partition, so the coordinator moves with the lead (the old leader gives its groups up,
the new one loads them from its replica; members join again at most) and the committed
offsets, being the log, go with it. The others are refused (:func:`internal_refusal`): their
leaders place them themselves (``__security``, ``__queue_definitions``, the nodes' audit
logs), a durable queue's two partitions must stay on the same replicas, and ``__streams``
holds in-memory messages on its leaders only, which a move of the lead would drop.

``--replication-factor N`` is a reassignment of every partition (:func:`plan_replication`):
more replicas are placed on the nodes holding fewest, fewer keep the leader and in-sync ones.

Altering a topic (:func:`alter_topic`) writes its entry in etcd (compare-and-swap on its
version): new partitions are placed by :func:`~tidewire.cluster.controller.assign` and made by
their replicas as any new partition; new settings and ``min_insync_replicas`` are applied by
every node's reconcile pass to its local logs and the partitions it leads.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import msgspec

from tidewire.broker.offsets import (
    OFFSETS_TOPIC,
    QUEUE_DEFINITIONS_TOPIC,
    QUEUE_TOPIC_PREFIX,
    STREAMS_TOPIC,
    is_internal_topic,
)
from tidewire.cluster.etcd import EtcdError
from tidewire.cluster.metadata import (
    NO_LEADER,
    Fence,
    MetadataCache,
    MetadataStore,
    PartitionState,
    TopicInfo,
)
from tidewire.errors import (
    InvalidConfigError,
    InvalidRequestError,
    InvalidTopicError,
    RequestTimedOutError,
    TidewireError,
    UnknownTopicError,
)
from tidewire.storage import LogConfig

if TYPE_CHECKING:
    from tidewire.cluster.node import ClusterNode

__all__ = [
    "PartitionMove",
    "alter_topic",
    "cancel",
    "internal_refusal",
    "plan_replication",
    "reassign",
    "reconcile_reassignments",
    "revert",
    "status",
    "step",
    "sync_local",
]

log = logging.getLogger("tidewire.cluster.reassign")

#: Attempts of a compare-and-swap that lost to a concurrent change before the request fails
#: (each reads the topic again; more than a few means someone else keeps changing it).
CAS_ATTEMPTS = 5
#: How long a request waits for this node's copy of the metadata to show its change.
ADMIN_WAIT_S = 30.0


def internal_refusal(topic: str) -> str | None:
    """Why the partitions of ``topic`` are not moved (or their moves cancelled) on request;
    None for a topic that may be moved: any topic of the users', and ``__consumer_offsets``
    (see the module docstring)."""
    if not is_internal_topic(topic) or topic == OFFSETS_TOPIC:
        return None
    if topic in ("__security", QUEUE_DEFINITIONS_TOPIC):
        why = (
            "its leader keeps it on every live node itself (a node gone for 10 minutes is "
            "replaced by a live one)"
        )
    elif topic.startswith("__audit."):
        why = (
            "a node's audit log is placed by its leader (the node itself first, on up to "
            "three live nodes; a node gone for 10 minutes is replaced)"
        )
    elif topic.startswith(QUEUE_TOPIC_PREFIX):
        why = (
            "a durable queue's log: its two partitions must stay on the same replicas in the "
            "same order, which moves of single partitions cannot keep"
        )
    elif topic == STREAMS_TOPIC:
        why = (
            "its leaders hold the streams' in-memory messages, which a move of the lead would drop"
        )
    else:
        why = "the broker places it itself"
    return f"topic {topic!r} is internal and not moved on request: {why}"


class PartitionMove(msgspec.Struct, frozen=True):
    """A partition as a reassignment sees it: replicas, ISR, leader, and while a move is
    under way its target replica set and the set it had when the move started (``original``;
    empty when no move is under way, or when not known)."""

    partition: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    target: tuple[int, ...] = ()
    original: tuple[int, ...] = ()

    @property
    def adding(self) -> tuple[int, ...]:
        """The replicas the move under way adds (none known without ``original``)."""
        if not self.target or not self.original:
            return ()
        return tuple(r for r in self.target if r not in self.original)

    @property
    def removing(self) -> tuple[int, ...]:
        """The replicas the move under way removes."""
        if not self.target:
            return ()
        base = self.original or self.replicas
        return tuple(r for r in base if r not in self.target)


def step(state: PartitionState, target: Sequence[int]) -> tuple[PartitionState, bool] | None:
    """The next state of a partition being moved to ``target``, and whether it ends the move;
    None while it waits (new replicas not yet in sync, or no leader).

    The replica set first grows to target + leaving replicas; once every target replica is in
    the ISR it becomes the target, its leader one of them (the next epoch if it changed).
    """
    want = tuple(target)
    if not set(want) <= set(state.replicas):
        leaving = tuple(r for r in state.replicas if r not in want)
        return PartitionState(want + leaving, state.leader, state.leader_epoch, state.isr), False
    if state.leader == NO_LEADER or not set(want) <= set(state.isr):
        return None
    isr = tuple(r for r in want if r in state.isr)
    if state.leader in want:
        return PartitionState(want, state.leader, state.leader_epoch, isr), True
    return PartitionState(want, isr[0], state.leader_epoch + 1, isr), True


async def reconcile_reassignments(store: MetadataStore, cache: MetadataCache, fence: Fence) -> bool:
    """The controller's pass over the moves under way: one :func:`step` each. False when a
    write found the controller's fence gone."""
    for (topic, p), target in sorted(cache.reassignments.items()):
        got = cache.partition(topic, p)
        if got is None:
            continue  # its topic is being deleted
        state, version = got
        nxt = step(state, target)
        if nxt is None:
            continue
        new, final = nxt
        try:
            if final:
                ok = await store.finish_reassignment(topic, p, new, version, fence)
            else:
                ok = await store.set_partition(topic, p, new, version, fence)
        except EtcdError as exc:
            log.warning("reassignment of %s/%d not advanced (%s); next pass", topic, p, exc)
            continue
        if ok:
            log.info(
                "reassignment of %s/%d: replicas %s leader %d epoch %d isr %s%s",
                topic,
                p,
                list(new.replicas),
                new.leader,
                new.leader_epoch,
                list(new.isr),
                " (done)" if final else "",
            )
            continue
        held = await store.etcd.get(fence.key)
        if held is None or held.create_revision != fence.rev:
            return False
    # A topic's replication factor follows its moves once they are all done. Compared on
    # every partition's version: a copy that is behind writes nothing (the next pass does).
    for info, version, versions in _replication_factors(cache):
        try:
            ok = await store.set_replication_factor(info, version, versions, fence)
        except EtcdError as exc:
            log.warning("topic %s: replication factor not updated (%s)", info.name, exc)
            continue
        if ok:
            log.info("topic %s: replication factor now %d", info.name, info.replication_factor)
    return True


def _replication_factors(cache: MetadataCache) -> list[tuple[TopicInfo, int, dict[int, int]]]:
    """Topics whose entry names another replication factor than every one of their
    partitions has (a move changed it), with no move under way: each with its new entry,
    its version and its partitions' versions."""
    moving = {t for t, _ in cache.reassignments}
    out = []
    for name, info in sorted(cache.topics.items()):
        version = cache.topic_versions.get(name)
        if name in moving or version is None:
            continue
        sizes, versions = set(), {}
        for p in range(info.partitions):
            got = cache.partition(name, p)
            if got is None:
                break
            sizes.add(len(got[0].replicas))
            versions[p] = got[1]
        else:
            if len(sizes) == 1 and info.replication_factor not in sizes:
                rf = sizes.pop()
                new = TopicInfo(info.name, info.partitions, rf, info.config, info.topic_id)
                out.append((new, version, versions))
    return out


def revert(state: PartitionState, original: Sequence[int]) -> PartitionState | None:
    """The state a cancelled move leaves a partition in (KIP-455): the replica set it had
    before the move (``original``; empty, as in entries written before cancels existed: the
    replicas it has now, none removed), its ISR what of that set is in sync, its leader kept
    when it is in that set, else the first in-sync one at the next epoch. None: no replica
    of that set is in sync, so going back would lose what only the new replicas hold.
    """
    replicas = tuple(original) or state.replicas
    isr = tuple(r for r in replicas if r in state.isr)
    if state.leader == NO_LEADER or state.leader in replicas:
        return PartitionState(replicas, state.leader, state.leader_epoch, isr)
    if not isr:
        return None
    return PartitionState(replicas, isr[0], state.leader_epoch + 1, isr)


def plan_replication(
    states: dict[int, PartitionState], replication_factor: int, live: Sequence[int]
) -> dict[int, tuple[int, ...]]:
    """Target replica sets giving each partition ``replication_factor`` replicas (those
    already right are left out). More: the live nodes holding fewest replicas of the topic
    are added (ties by id). Fewer: the leader stays, then in-sync replicas, in replica order.

    Raises:
        InvalidRequestError: fewer live nodes than ``replication_factor``, or it is below 1.
    """
    nodes = sorted(set(live))
    if not 1 <= replication_factor <= len(nodes):
        raise InvalidRequestError(
            f"replication factor {replication_factor} must be within 1..{len(nodes)} (the "
            f"live nodes: {', '.join(map(str, nodes)) or 'none'})"
        )
    load = dict.fromkeys(nodes, 0)
    for st in states.values():
        for r in st.replicas:
            if r in load:
                load[r] += 1
    out: dict[int, tuple[int, ...]] = {}
    for p, st in sorted(states.items()):
        current = list(st.replicas)
        if len(current) == replication_factor:
            continue
        if len(current) < replication_factor:
            spare = sorted((n for n in nodes if n not in current), key=lambda n: (load[n], n))
            added = spare[: replication_factor - len(current)]
            for n in added:
                load[n] += 1
            out[p] = (*current, *added)
        else:

            def rank(r: int, st: PartitionState = st) -> tuple[int, int]:
                return (r != st.leader, r not in st.isr)

            kept = sorted(current, key=lambda r: (*rank(r), current.index(r)))
            out[p] = tuple(kept[:replication_factor])
    return out


def status(node: ClusterNode, topic: str) -> list[PartitionMove]:
    """Each partition of ``topic`` with the target of its move under way, if any.

    Raises:
        UnknownTopicError: no such topic in the cluster.
    """
    info = node.cache.topics.get(topic)
    if info is None:
        raise UnknownTopicError(f"topic {topic!r} does not exist")
    out = []
    for p in range(info.partitions):
        got = node.cache.partition(topic, p)
        if got is None:
            continue
        st = got[0]
        out.append(
            PartitionMove(
                p,
                st.replicas,
                st.isr,
                st.leader,
                st.leader_epoch,
                node.cache.reassignments.get((topic, p), ()),
                node.cache.reassignment_origins.get((topic, p), ()),
            )
        )
    return out


async def _read_topic(node: ClusterNode, topic: str) -> tuple[TopicInfo, int]:
    try:
        kv = await node.etcd.get(node.store.topic_key(topic))
    except EtcdError as exc:
        raise RequestTimedOutError(f"topic {topic!r} not read from etcd: {exc}") from None
    if kv is None:
        raise UnknownTopicError(f"topic {topic!r} does not exist")
    return msgspec.json.decode(kv.value, type=TopicInfo), kv.mod_revision


async def reassign(
    node: ClusterNode,
    topic: str,
    targets: Mapping[int, Sequence[int]] | None = None,
    *,
    replication_factor: int | None = None,
) -> list[PartitionMove]:
    """Start moving partitions of ``topic``: to the given replica sets, or to
    ``replication_factor`` replicas each (:func:`plan_replication`). Answered once etcd
    holds the targets (the controller carries them out; see :func:`status`).

    Raises:
        UnknownTopicError: no such topic.
        InvalidRequestError: an internal topic other than ``__consumer_offsets``
            (:func:`internal_refusal` says why), an unknown partition, a replica set with
            repeats, unknown nodes or fewer replicas than ``min_insync_replicas``, or a
            partition being moved already.
        RequestTimedOutError: etcd did not answer.
    """
    node._check_started()
    if (refused := internal_refusal(topic)) is not None:
        raise InvalidRequestError(refused)
    if (targets is None) == (replication_factor is None):
        raise InvalidRequestError("give either replica sets or a replication factor")
    for _ in range(CAS_ATTEMPTS):
        info, version = await _read_topic(node, topic)
        live = sorted(node.cache.nodes)
        states = {
            p: got[0]
            for p in range(info.partitions)
            if (got := node.cache.partition(topic, p)) is not None
        }
        if replication_factor is not None:
            plan = plan_replication(states, replication_factor, live)
        else:
            assert targets is not None
            plan = {p: tuple(t) for p, t in targets.items()}
        min_insync = node.min_insync_of(info)
        for p, target in plan.items():
            if p not in states:
                raise InvalidRequestError(
                    f"topic {topic!r} has no partition {p} (it has {info.partitions})"
                )
            if not target or len(set(target)) != len(target):
                raise InvalidRequestError(f"partition {p}: replicas {list(target)} repeat or none")
            unknown = sorted(set(target) - set(live))
            if unknown:
                raise InvalidRequestError(
                    f"partition {p}: nodes {unknown} are not live nodes of the cluster "
                    f"({', '.join(map(str, live))})"
                )
            if len(target) < min_insync:
                raise InvalidRequestError(
                    f"partition {p}: {len(target)} replicas, fewer than "
                    f"min_insync_replicas={min_insync}: acks=all could never be answered"
                )
            if (topic, p) in node.cache.reassignments:
                raise InvalidRequestError(f"partition {p} of {topic!r} is being moved already")
        if not plan:
            return status(node, topic)
        originals = {p: states[p].replicas for p in plan}
        try:
            rev = await node.store.start_reassignments(topic, version, plan, originals)
        except EtcdError as exc:
            raise RequestTimedOutError(f"reassignment of {topic!r} not started: {exc}") from None
        if rev is not None:
            log.info("reassignment of %s started: %s", topic, plan)

            def seen(rev: int = rev) -> bool:
                return node.cache.revision >= rev

            try:  # so that the status answered shows the move
                await node.cache.wait_for(seen, ADMIN_WAIT_S)
            except TimeoutError:
                raise RequestTimedOutError(
                    f"reassignment of {topic!r} started, but node {node.node_id} did not see "
                    f"it within {ADMIN_WAIT_S:.0f} s"
                ) from None
            return status(node, topic)
        # The topic changed or a move started meanwhile: read again.
    raise InvalidRequestError(
        f"topic {topic!r} kept changing (or its partitions are being moved); try again"
    )


async def cancel(
    node: ClusterNode, topic: str, partitions: Sequence[int] = ()
) -> list[PartitionMove]:
    """Cancel the moves under way of ``topic``'s ``partitions`` (none given: every one of
    its partitions being moved): each goes back to the replica set it had when its move
    started (:func:`revert`), the end of its move written with it in one compare-and-swap.
    A move that ends meanwhile stays done. Answered once this node's copy of the metadata
    shows the moves ended.

    Raises:
        UnknownTopicError: no such topic.
        InvalidRequestError: an internal topic other than ``__consumer_offsets``, a
            partition given that is not being moved,
            or a move whose original replicas are none of them in sync (it is left to
            finish).
        RequestTimedOutError: etcd did not answer.
    """
    node._check_started()
    if (refused := internal_refusal(topic)) is not None:
        raise InvalidRequestError(refused)
    cache = node.cache
    if topic not in cache.topics:
        raise UnknownTopicError(f"topic {topic!r} does not exist")
    moving = sorted(p for t, p in cache.reassignments if t == topic)
    wanted = sorted(set(partitions)) if partitions else moving
    idle = [p for p in wanted if p not in moving]
    if idle:
        raise InvalidRequestError(
            f"topic {topic!r}: partition(s) {idle} are not being moved, nothing to cancel"
        )
    for p in wanted:
        await _cancel_one(node, topic, p)

    def ended() -> bool:
        return all((topic, p) not in cache.reassignments for p in wanted)

    try:
        await cache.wait_for(ended, ADMIN_WAIT_S)
    except TimeoutError:
        raise RequestTimedOutError(
            f"moves of {topic!r} cancelled, but node {node.node_id} did not see it within "
            f"{ADMIN_WAIT_S:.0f} s"
        ) from None
    log.info("reassignment of %s cancelled: partitions %s", topic, wanted)
    return status(node, topic)


async def _cancel_one(node: ClusterNode, topic: str, p: int) -> None:
    from tidewire.cluster.metadata import Reassignment  # noqa: PLC0415

    store = node.store
    for _ in range(CAS_ATTEMPTS):
        try:
            moving = await node.etcd.get(store.reassign_key(topic, p))
            if moving is None:
                return  # it ended meanwhile
            current = await node.etcd.get(store.partition_key(topic, p))
            if current is None:
                return  # its topic is being deleted
            original = msgspec.json.decode(moving.value, type=Reassignment).original
            state = msgspec.json.decode(current.value, type=PartitionState)
            new = revert(state, original)
            if new is None:
                raise InvalidRequestError(
                    f"partition {p} of {topic!r}: none of its original replicas "
                    f"{list(original)} is in sync (ISR {list(state.isr)}); going back would "
                    "lose records only the new replicas hold: let the move finish"
                )
            if await store.finish_reassignment(topic, p, new, current.mod_revision, None):
                log.info(
                    "reassignment of %s/%d cancelled: replicas %s leader %d epoch %d isr %s",
                    topic,
                    p,
                    list(new.replicas),
                    new.leader,
                    new.leader_epoch,
                    list(new.isr),
                )
                return
        except EtcdError as exc:
            raise RequestTimedOutError(
                f"reassignment of {topic}/{p} not cancelled: {exc}"
            ) from None
    raise RequestTimedOutError(f"partition {p} of {topic!r} kept changing; try again")


async def alter_topic(
    node: ClusterNode,
    topic: str,
    *,
    partitions: int | None = None,
    config: LogConfig | None = None,
    min_insync_replicas: int | None = None,
    unclean_leader_election: bool | None = None,
) -> TopicInfo:
    """Change a cluster's topic in etcd: more partitions (placed over the live nodes), other
    log settings, ``min_insync_replicas`` or ``unclean_leader_election``. Answered once this
    node's copy of the metadata has the change.

    Raises:
        UnknownTopicError, InvalidTopicError (fewer partitions, an internal topic),
        InvalidConfigError (``min_insync_replicas`` outside 1..replication factor),
        RequestTimedOutError (etcd did not answer, or kept changing).
    """
    from tidewire.cluster.controller import assign  # noqa: PLC0415 (it imports this module)
    from tidewire.cluster.node import (  # noqa: PLC0415 (node imports this module)
        MAX_PARTITIONS,
        MIN_INSYNC_KEY,
        UNCLEAN_KEY,
        config_to_strings,
    )

    node._check_started()
    if is_internal_topic(topic):
        raise InvalidTopicError(f"topic {topic!r} is internal to the broker")
    for _ in range(CAS_ATTEMPTS):
        info, version = await _read_topic(node, topic)
        n = info.partitions if partitions is None else partitions
        if not info.partitions <= n <= MAX_PARTITIONS:
            raise InvalidTopicError(
                f"partitions={n} must be within {info.partitions}..{MAX_PARTITIONS:,}: a "
                "topic can gain partitions but not lose them"
            )
        strings = dict(info.config)
        if config is not None:
            strings.update(config_to_strings(config))
        if min_insync_replicas is not None:
            if not 1 <= min_insync_replicas <= info.replication_factor:
                raise InvalidConfigError(
                    f"min_insync_replicas={min_insync_replicas} must be within "
                    f"1..{info.replication_factor} (the replication factor)"
                )
            strings[MIN_INSYNC_KEY] = str(min_insync_replicas)
        if unclean_leader_election is not None:
            strings[UNCLEAN_KEY] = "true" if unclean_leader_election else "false"
        new_parts: dict[int, Sequence[int]] = {}
        if n > info.partitions:
            live = sorted(node.cache.nodes)
            try:
                placed = assign(
                    n - info.partitions,
                    info.replication_factor,
                    live,
                    random.randrange(max(1, len(live))),
                )
            except ValueError as exc:
                raise InvalidTopicError(str(exc)) from None
            new_parts = {info.partitions + i: r for i, r in enumerate(placed)}
        new = TopicInfo(info.name, n, info.replication_factor, strings, info.topic_id)
        try:
            ok = await node.store.alter_topic(new, version, new_parts)
        except EtcdError as exc:
            raise RequestTimedOutError(f"topic {topic!r} not altered: {exc}") from None
        if ok:
            log.info("altered topic %s: %s (new partitions %s)", topic, new, new_parts)
            here = [(topic, p) for p, r in new_parts.items() if node.node_id in r]

            def applied(new: TopicInfo = new, here: list[tuple[str, int]] = here) -> bool:
                return node.cache.topics.get(topic) == new and all(k in node._applied for k in here)

            await node._await_local(
                f"topic {topic!r} was altered in the cluster, but node {node.node_id} did not",
                applied,
            )
            return new
    raise RequestTimedOutError(f"topic {topic!r} kept changing; try again")


async def sync_local(node: ClusterNode, topic: str, info: TopicInfo) -> bool:
    """Make this node's logs of ``topic`` follow etcd: the topic's settings applied to each
    local log, and the logs of partitions this node is no replica of any more (moved away,
    also while it was down) stopped and deleted. False: something is left for the next pass.
    """
    from tidewire.cluster.node import config_of  # noqa: PLC0415 (node imports this module)

    broker = node.broker
    logs = broker.logs
    cfg = config_of(info, broker.config.log)
    done = True
    for p in sorted(logs._parts.get(topic, set())):
        plog = logs.logs.get((topic, p))
        if plog is None:
            continue
        got = node.cache.partition(topic, p)
        movable = not is_internal_topic(topic) or topic == OFFSETS_TOPIC
        if got is not None and node.node_id not in got[0].replicas and movable:
            try:
                if node.replication is not None:
                    await node.replication.stop_replica(topic, p)
                node._applied.pop((topic, p), None)
                await logs.delete_partition_async(topic, p)
            except TidewireError as exc:
                log.warning("partition %s/%d moved away, log not deleted yet: %s", topic, p, exc)
                done = False
                continue
            broker._producers.pop((topic, p), None)
            broker._wake(topic, p)
            log.info("partition %s/%d moved to other nodes: its log here is deleted", topic, p)
            continue
        if plog.config != cfg and not is_internal_topic(topic):
            try:
                logs.set_config(topic, p, cfg)
            except TidewireError as exc:
                log.warning("partition %s/%d: settings not applied yet: %s", topic, p, exc)
                done = False
    return done
