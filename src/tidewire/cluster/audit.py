"""The audit log of a cluster: each node's events in a replicated topic of its own.

On a single node the audit log (:class:`~tidewire.security.audit.AuditLog`) is the node's
own log ``__audit``. In a cluster each node writes its events, stamped with its node id, to
the internal topic ``__audit.<node id>`` (one partition), kept in etcd like any topic:

- **Made on first use.** The node's first event creates its topic through etcd, replicated
  on ``min(3, live nodes)`` nodes, the node first (so it leads at epoch 0). While fewer
  nodes than that hold it (the cluster was still forming), its leader moves it onto more
  live nodes (a reassignment), up to three. A replica whose node has been gone for
  :data:`~tidewire.cluster.security.DEAD_NODE_S` is replaced by a live node in the same way
  (the owner's own copy too: its events stay readable, on three other nodes); an owner that
  comes back is moved onto its topic again, then leads it.
- **Written by its node only, while it leads it.** Appending is local (the writer never
  waits on the network, and never blocks a request); followers copy the log as any
  partition's. While the node does not lead its topic (just started, or its leadership went
  to another replica while it was away) its events wait in the audit log's bounded buffer.
  A leader of another node's audit topic hands the leadership back (at the next epoch) as
  soon as that node is alive and in the ISR, so the node writes again.
- **Read from any node.** A query asks every node's audit log: this node reads the ones it
  holds a replica of, and asks a node holding each of the others (its leader first) with
  ``DESCRIBE_AUDIT`` limited to those ``nodes`` (which the nodes' own identity may ask:
  ``cluster_action``); the events are merged by time. A node that does not answer within
  :data:`ASK_TIMEOUT_S` is passed over for another holder of the same logs; the logs none
  answered for are named in the answer's ``missing_nodes`` (partial, not failed).
- **Durability.** A node's events are acknowledged to nobody: what its followers copied
  survives the loss of the node; the events it appended in the last moments before a crash,
  not yet copied, are lost with it (as with ``fsync=interval`` on one node).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Collection
from typing import TYPE_CHECKING

import msgspec

from tidewire.cluster.controller import assign
from tidewire.cluster.etcd import EtcdError
from tidewire.cluster.fetcher import default_connect
from tidewire.cluster.metadata import PartitionState, TopicInfo
from tidewire.errors import TidewireError, for_code
from tidewire.protocol.messages import DescribeAuditRequest
from tidewire.security._logs import audit_node_of, audit_topic, open_log
from tidewire.security.audit import AuditAnswer, AuditEvent, AuditQuery, newest
from tidewire.storage import PartitionLog
from tidewire.storage.fs import write_atomic

if TYPE_CHECKING:
    from tidewire.cluster.node import ClusterNode

__all__ = ["ASK_TIMEOUT_S", "AUDIT_REPLICAS", "ClusterAudit", "placement"]

log = logging.getLogger("tidewire.cluster.audit")

#: Copies of each node's audit log: the log is written by one node and read rarely, so three
#: (the node and two others) are enough to outlive the loss of any two nodes.
AUDIT_REPLICAS = 3
#: How long a query waits for another node's answer (s): its audit logs are read locally,
#: so a live node answers well within this; one that does not is left out of the answer
#: (named in ``missing_nodes``) rather than holding the whole query up.
ASK_TIMEOUT_S = 5.0
#: After a failed attempt to create this node's audit topic, the next one comes this late.
CREATE_RETRY_S = 1.0


class ClusterAudit:
    """Where ``node``'s audit log lives in its cluster (see the module docstring); an
    :class:`~tidewire.security.audit.AuditReplication`."""

    def __init__(self, node: ClusterNode) -> None:
        self._node = node
        self.topic = audit_topic(node.node_id)
        self._key = (self.topic, 0)
        self._create_task: asyncio.Task[None] | None = None
        self._create_after = 0.0
        self._closing = False  # set by close(): no creation task is started after it

    # --- writing ------------------------------------------------------------------------------

    def writable(self) -> PartitionLog | None:
        node = self._node
        if not node.started:
            return None
        if self.topic not in node.cache.topics:
            self._create_soon()
            return None
        role = node._applied.get(self._key)
        if role is None or role[0] != "leader":
            return None
        return node.broker.logs.logs.get(self._key)

    def appended(self) -> None:
        self._node.broker._wake(*self._key)  # followers waiting in a fetch take it at once

    def _create_soon(self) -> None:
        loop = asyncio.get_running_loop()
        if self._closing or (self._create_task is not None and not self._create_task.done()):
            return
        if loop.time() < self._create_after:
            return
        self._create_after = loop.time() + CREATE_RETRY_S
        self._create_task = loop.create_task(
            self.ensure_topic(), name=f"node {self._node.node_id}: {self.topic}"
        )
        self._create_task.add_done_callback(_log_failure)

    async def ensure_topic(self) -> None:
        """Create this node's audit topic through etcd unless it exists: this node first in
        its replicas (its leader at epoch 0), ``min(3, live nodes)`` of them, its local log
        (with the audit log's settings) adopted as the topic's. Never raises: a failure is
        logged and tried again at a later event."""
        node = self._node
        audit = node.broker.audit
        live = sorted(node.cache.nodes)
        if audit is None or node.node_id not in live:
            return
        try:
            if await node.etcd.get(node.store.topic_key(self.topic)) is not None:
                return  # made meanwhile (this node's copy of the metadata lags)
            rf = min(AUDIT_REPLICAS, len(live))
            (replicas,) = assign(1, rf, live, live.index(node.node_id))
            topic_id = uuid.uuid4().hex
            cfg = audit.config
            plog = open_log(node.broker.logs, self.topic, cfg)
            from tidewire.cluster.node import TOPIC_ID_FILE, config_to_strings  # noqa: PLC0415

            fs = node.broker.logs.fs
            await asyncio.to_thread(
                write_atomic, fs, f"{plog.directory}/{TOPIC_ID_FILE}", topic_id.encode()
            )
            info = TopicInfo(self.topic, 1, rf, config_to_strings(cfg), topic_id)
            if await node.store.create_topic(info, [replicas], None):
                log.info("created %s: replicas %s", self.topic, list(replicas))
        except (EtcdError, TidewireError, OSError) as exc:
            log.warning("%s not created yet (tried again later): %s", self.topic, exc)

    # --- the reconcile pass ---------------------------------------------------------------------

    async def reconcile(self) -> bool:
        """From the node's reconcile pass, for the audit topics this node leads: hand back
        another node's, once that node is alive and in sync; move each onto the replicas it
        should have (see :func:`placement`). False: something is left for the next pass."""
        node = self._node
        done = True
        for name in [t for t in node.cache.topics if audit_node_of(t) is not None]:
            owner = audit_node_of(name)
            got = node.cache.partition(name, 0)
            if owner is None or got is None:
                continue
            state = got[0]
            if state.leader != node.node_id:
                continue
            if owner != node.node_id and owner in node.cache.nodes and owner in state.isr:
                done = await self._hand_back(name, owner, state.leader_epoch) and done
            elif (name, 0) not in node.cache.reassignments:
                dead = node.dead_replicas.dead(state.replicas)
                target = placement(owner, state.replicas, sorted(node.cache.nodes), dead)
                if target != state.replicas:
                    done = await self._move(name, state, target) and done
        return done

    async def _hand_back(self, name: str, owner: int, epoch: int) -> bool:
        node = self._node
        try:
            got = await node._led_at(name, 0, epoch)
            if got is None:
                return True  # not ours at that epoch any more: nothing to do here
            state, version = got
            if owner not in state.isr:
                return True
            new = PartitionState(state.replicas, owner, epoch + 1, state.isr)
            ok = await node.store.set_partition(name, 0, new, version)
        except EtcdError as exc:
            log.warning("%s: not handed back to node %d yet: %s", name, owner, exc)
            return False
        if ok:
            log.info("%s: handed back to node %d at epoch %d", name, owner, epoch + 1)
        return ok

    async def _move(self, name: str, state: PartitionState, target: tuple[int, ...]) -> bool:
        node = self._node
        from tidewire.cluster.reassign import _read_topic  # noqa: PLC0415 (imports node)

        try:
            _, version = await _read_topic(node, name)
            rev = await node.store.start_reassignments(
                name, version, {0: target}, {0: state.replicas}
            )
        except (EtcdError, TidewireError) as exc:
            log.warning("%s not moved to %s yet: %s", name, list(target), exc)
            return False
        if rev is None:
            return False
        log.info("%s: replicas %s -> %s", name, list(state.replicas), list(target))
        return True

    # --- reading ------------------------------------------------------------------------------

    def local_logs(self, nodes: Collection[int]) -> list[PartitionLog]:
        node = self._node
        out = []
        for n in sorted(set(nodes)):
            key = (audit_topic(n), 0)
            got = node.cache.partition(*key)
            plog = node.broker.logs.logs.get(key)
            if got is not None and node.node_id in got[0].replicas and plog is not None:
                out.append(plog)
        return out

    async def query(self, query: AuditQuery, limit: int) -> AuditAnswer:
        """Every node's audit log: read here where this node holds an in-sync replica,
        asked of a node holding one otherwise (its leader first, then the ISR, then the
        other replicas; the nodes asked at once, each for at most :data:`ASK_TIMEOUT_S`).
        A log that no node holding it answered for in time, or none of whose replicas is on
        a live node, is left out and its node named in ``missing_nodes``: a partial answer
        rather than none while a node does not answer.

        Raises:
            TidewireError: a node asked refused (an error that retrying cannot mend, such
                as a missing permission of the node principal).
        """
        node = self._node
        audit = node.broker.audit
        if audit is None:
            return AuditAnswer([])
        local: list[int] = []
        holders: dict[int, list[int]] = {}  # owner -> the live nodes to ask, in order
        missing: set[int] = set()
        for name in sorted(node.cache.topics):
            owner = audit_node_of(name)
            got = node.cache.partition(name, 0)
            if owner is None or got is None:
                continue
            state = got[0]
            # A copy out of the ISR may lack events (a replica still catching up): read here
            # only an in-sync one.
            if node.node_id in state.isr and (name, 0) in node.broker.logs.logs:
                local.append(owner)
                continue
            ask = [
                r
                for r in dict.fromkeys((state.leader, *state.isr, *state.replicas))
                if r in node.cache.nodes and r != node.node_id
            ]
            if not ask:
                log.warning("%s: no replica alive; its events are left out of the query", name)
                missing.add(owner)
                continue
            holders[owner] = ask
        events = await audit.query_nodes(query, limit, local) if local else []
        tried: dict[int, set[int]] = {owner: set() for owner in holders}
        failed: set[int] = set()  # nodes that did not answer: not asked again
        left = dict(holders)
        while left:  # each round asks one more holder of the logs still unread: bounded
            by_holder: dict[int, list[int]] = {}
            for owner, ask in left.items():
                nxt = next((h for h in ask if h not in failed and h not in tried[owner]), None)
                if nxt is None:
                    missing.add(owner)
                    continue
                tried[owner].add(nxt)
                by_holder.setdefault(nxt, []).append(owner)
            left = {}
            asked = sorted(by_holder.items())
            answers = await asyncio.gather(
                *(self._ask(h, query, limit, owners) for h, owners in asked)
            )
            for (h, owners), got_events in zip(asked, answers, strict=True):
                if got_events is None:
                    failed.add(h)
                    left.update((o, holders[o]) for o in owners)
                else:
                    events.extend(got_events)
        if missing:
            log.warning(
                "audit query: the logs of nodes %s were not read (no node holding them "
                "answered); the answer is partial",
                sorted(missing),
            )
        return AuditAnswer(newest(events, limit), tuple(sorted(missing)))

    async def _ask(
        self, holder: int, query: AuditQuery, limit: int, owners: list[int]
    ) -> list[AuditEvent] | None:
        """The events of the audit logs of ``owners`` as node ``holder``'s replicas hold
        them; None when it did not answer within :data:`ASK_TIMEOUT_S` (or could not be
        reached, or answered with a retriable error).

        Raises:
            TidewireError: it refused with an error that is not retriable.
        """
        node = self._node
        info = node.cache.nodes.get(holder)
        if info is None:
            return None
        link = (node.replica_connect or default_connect)(info.host, info.port)
        request = DescribeAuditRequest(
            since_ms=query.since_ms,
            until_ms=query.until_ms,
            principal=query.principal,
            action=query.action,
            outcome=query.outcome,
            limit=limit,
            nodes=owners,
        )
        try:
            async with asyncio.timeout(ASK_TIMEOUT_S):
                body = (await link.request(request, timeout_s=ASK_TIMEOUT_S)).body
        except (TimeoutError, OSError) as exc:
            log.warning("audit query: node %d did not answer: %s", holder, exc or "timed out")
            return None
        except TidewireError as exc:
            if not exc.retriable:
                raise
            log.warning("audit query: node %d did not answer: %s", holder, exc)
            return None
        finally:
            await link.close()
        if body.error_code:
            error = for_code(body.error_code)(
                f"the audit logs of nodes {owners} not read on node {holder}: {body.error_message}"
            )
            if error.retriable:
                log.warning("audit query: %s", error)
                return None
            raise error
        return [AuditEvent(**msgspec.structs.asdict(e)) for e in body.events]

    async def close(self) -> None:
        """Write what the audit log buffered while this node still leads its topic, then
        give the audit log back to the node (its own ``__audit`` again)."""
        # The flush below asks writable(), which would start a creation task that outlives
        # the node's etcd client (its request in flight then keeps a connection open).
        self._closing = True
        if self._create_task is not None:
            self._create_task.cancel()
            await asyncio.wait([self._create_task])
            self._create_task = None
        audit = self._node.broker.audit
        if audit is None:
            return
        try:
            await audit.flush()
        except TidewireError as exc:
            log.warning("audit: buffered events not written before leaving: %s", exc)
        audit.replicate(None)


def placement(
    owner: int, replicas: tuple[int, ...], live: list[int], dead: set[int]
) -> tuple[int, ...]:
    """The replicas node ``owner``'s audit log should have, from ``replicas`` now: without
    the ``dead`` ones; with its owner when the owner is live (first, so it leads once in
    sync); then topped up with live nodes (lowest ids first) up to ``min(3, live nodes)``,
    never dropping a replica that is not dead. Returns ``replicas`` itself when nothing is
    to change."""
    keep = [r for r in replicas if r not in dead]
    if owner in live and owner not in keep:
        keep.insert(0, owner)
    wanted = min(AUDIT_REPLICAS, len(live))
    spare = [n for n in live if n not in keep and n not in dead]
    keep.extend(spare[: max(wanted - len(keep), 0)])
    target = tuple(keep)
    return replicas if target == replicas or not target else target


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("creating the audit topic failed", exc_info=task.exception())
