"""The queues and exchanges of one broker: declaring, binding, publishing through exchanges,
consuming, settling, dead-lettering and replaying (:class:`QueueManager`, ``broker.queues``).

Durable exchanges, queues and bindings are kept in ``__queue_definitions``
(:class:`~.definitions.DefinitionStore`); a durable queue's messages and state in its own two
logs (:mod:`.store`); routing is :class:`~.routing.Router`'s. Everything runs on the broker's
event loop; deliveries are handed out in one pass per loop turn (:meth:`QueueManager._dispatch`),
so a burst of publishes reaches each consumer as few, large deliveries.

**In a cluster** (:meth:`QueueManager.replicate`, :mod:`tidewire.cluster.queues`) the durable
definitions are replicated on every node (changed on the leader of ``__queue_definitions``),
and a durable queue is served by its *owner* only: the node leading both partitions of its
topic ``__queue.Q``. The owner loads the queue from its replicas when it takes over
(:meth:`QueueManager.cluster_role`) and forgets it when it gives up (its consumers are told
the consumer was cancelled; what they held is delivered again by the next owner). Another
node answers a queue operation with NotLeaderError naming the owner, and forwards to the
owners the parts of an exchange's publish that reach queues it does not serve. Transient
queues stay the node's own.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import time
import zlib
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar

from tidewire._tasks import wait_event
from tidewire.broker.queues.definitions import DefinitionsReplication, DefinitionStore
from tidewire.broker.queues.model import (
    DEATH_HEADER,
    DEFAULT_EXCHANGE,
    OVERFLOW_POLICIES,
    Binding,
    Delivery,
    ExchangeSpec,
    PublishResult,
    QueueSpec,
    QueueStatus,
    SettleOutcome,
    check_name,
)
from tidewire.broker.queues.queue import Consumer, DeathReason, Queue
from tidewire.broker.queues.routing import Router
from tidewire.broker.queues.store import (
    COUNTS,
    QUEUE_TOPIC_PREFIX,
    DurableMessages,
    MemoryMessages,
    QueueReplication,
    StateLog,
    open_logs,
    queue_topic,
)
from tidewire.errors import (
    InvalidQueueError,
    NotLeaderError,
    PreconditionFailedError,
    QueueLockedError,
    TidewireError,
    UnknownDeliveryTagError,
    UnknownExchangeError,
    UnknownQueueError,
    UnknownTopicError,
    UnroutableError,
)
from tidewire.records import BatchBuilder, BatchHeader

if TYPE_CHECKING:
    from tidewire.broker.core import Broker

__all__ = ["MAX_PREFETCH", "QueueCluster", "QueueManager"]

log = logging.getLogger("tidewire.broker.queues")

#: The largest prefetch window a consumer may ask for: what it holds is kept in memory.
MAX_PREFETCH = 65_536
#: Messages one get may take at most.
MAX_GET = 10_000
#: Messages one replay moves at most (call again for more).
MAX_REPLAY = 100_000
#: The shortest sleep of the timer loop (seconds): timers due closer together are applied
#: together.
TICK_S = 0.005
#: How often queues whose messages can expire are swept (seconds): an expired message is
#: never delivered in any case; this is how soon it reaches the dead-letter exchange.
TTL_SWEEP_S = 0.1
#: How often settled segments are given back and state logs compacted (seconds).
UPKEEP_S = 1.0
#: A queue's logs made as replicas of a cluster's topic carry this file (the cluster node's
#: ``TOPIC_ID_FILE``): they are kept at start even when this node's copy of the definitions
#: does not name the queue yet (it may lag); the cluster deletes them with the topic.
_CLUSTER_ID_FILE = "topic-id"


P = ParamSpec("P")
R = TypeVar("R")
_Method = Callable[Concatenate["QueueManager", P], Coroutine[Any, Any, R]]


def _audited(action: str, kind: str = "queue") -> Callable[[_Method[P, R]], _Method[P, R]]:
    """Audit an administrative operation of the manager (``ok``, or ``failed`` with the
    error's message), whichever interface asked: who and from where are the request's
    (``current_actor``, set by the gate). A passive declare changes nothing: not audited."""

    def wrap(fn: _Method[P, R]) -> _Method[P, R]:
        async def audited(self: QueueManager, /, *args: P.args, **kwargs: P.kwargs) -> R:
            if kwargs.get("passive"):
                return await fn(self, *args, **kwargs)
            resource = _resource(args[0] if args else kwargs.get("name"), kind)
            try:
                out = await fn(self, *args, **kwargs)
            except TidewireError as exc:
                self._audit(action, resource, exc)
                raise
            self._audit(action, resource, None)
            return out

        functools.update_wrapper(audited, fn)  # the name and docstring stay fn's
        return audited

    return wrap


def _resource(target: object, kind: str) -> str:
    """How an audit event names what an operation touched (``kind``: of a plain name)."""
    if isinstance(target, ExchangeSpec):
        return f"exchange:{target.name}"
    if isinstance(target, QueueSpec):
        return f"queue:{target.name}"
    if isinstance(target, Binding):
        return f"exchange:{target.exchange} -> {target.destination_kind}:{target.destination}"
    return f"{kind}:{target}"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class QueueCluster(Protocol):
    """What the queues need of the cluster (:class:`tidewire.cluster.queues.ClusterQueues`)."""

    def definitions(self) -> DefinitionsReplication:
        """How ``__queue_definitions`` is written."""
        ...

    def log_replication(self, topic: str, partition: int) -> QueueReplication:
        """How one partition of a queue's topic is written."""
        ...

    def owns(self, name: str) -> bool:
        """Whether this node leads both partitions of durable queue ``name``'s topic."""
        ...

    def not_owner(self, name: str) -> NotLeaderError:
        """The error a queue operation gets on a node that does not serve ``name``."""
        ...

    def owner_of(self, name: str) -> int:
        """The node id of queue ``name``'s owner (of a durable queue, or of a transient one
        declared on another node), as this node's copy of the metadata has it (-1: none
        now)."""
        ...

    def transient_owner(self, name: str) -> int:
        """The node serving transient queue ``name``, when another node declared it (-1:
        none, or this node)."""
        ...

    def transient_specs(self) -> dict[str, QueueSpec]:
        """The transient queues other nodes declared and serve: their settings, by name."""
        ...

    async def claim_transient(self, spec: QueueSpec) -> None:
        """Record this node as the owner of transient queue ``spec`` (raises NotLeaderError
        naming the node that holds it)."""

    async def release_transient(self, name: str) -> None:
        """Transient queue ``name``, declared here, is deleted: its owner record goes."""

    async def create_queue_topic(self, name: str) -> None:
        """Create ``__queue.<name>`` through etcd (nothing when it exists)."""

    async def delete_queue_topic(self, name: str) -> None:
        """Delete ``__queue.<name>`` through etcd (nothing when it does not exist)."""

    async def forward(self, queue: str, data: bytes, *, ttl_ms: int, deliver_at_ms: int) -> None:
        """Publish ``data`` to durable queue ``queue`` on its owner (through the default
        exchange); return once the owner confirmed it."""

    async def owner_usage(self, name: str) -> tuple[int, int]:
        """Durable queue ``name``'s unsettled messages and consumers, asked of its owner
        (another node)."""
        ...

    async def delete_at_definitions_leader(self, name: str) -> None:
        """Have the leader of the definitions delete durable queue ``name`` if unused."""


class QueueManager:
    """Every queue and exchange of ``broker`` (see the module docstring).

    Args:
        broker: the broker (its logs open).
        clock: ms since the epoch; tests pass a fake one and call :meth:`tick`.
    """

    def __init__(self, broker: Broker, *, clock: Callable[[], int] | None = None) -> None:
        self.broker = broker
        self.clock = clock or _now_ms
        self.definitions = DefinitionStore(broker.logs)
        self._queues: dict[str, Queue] = {}
        self.router = Router(
            lambda name: name in self._queues or name in self._specs or self._elsewhere(name)
        )
        self._by_owner: dict[str, set[str]] = {}  # owner -> queues it consumes or gets from
        self._dirty: set[Queue] = set()
        self._scheduled = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ctags = itertools.count(1)
        self._timer_added = asyncio.Event()
        self._declaring: dict[str, QueueSpec] = {}  # durable declares being stored
        #: In a cluster: how the queues replicate, and every durable queue of the cluster
        #: (served here or not).
        self._cluster: QueueCluster | None = None
        self._specs: dict[str, QueueSpec] = {}

    # --- lifecycle ------------------------------------------------------------------------------

    def load(self) -> None:
        """Read the durable definitions and rebuild every durable queue from its logs; delete
        the logs of queues that no longer exist (a crash during a delete)."""
        defs = self.definitions.load()
        for e in defs.exchanges:
            self.router.add_exchange(e)
        for spec in defs.queues:
            plog, slog = open_logs(self.broker.logs, spec.name)
            q = self._new_queue(spec, DurableMessages(plog), StateLog(slog), "")
            q.recover()
            self._queues[spec.name] = q
        for b in defs.bindings:
            try:
                self.router.add_binding(b)
            except TidewireError as exc:
                log.warning("binding %s not restored: %s", b, exc)
        logs = self.broker.logs
        for topic in logs.topic_names():
            if (
                topic.startswith(QUEUE_TOPIC_PREFIX)
                and topic[len(QUEUE_TOPIC_PREFIX) :] not in self._queues
                and not logs.fs.exists(f"{logs.data_dir}/{topic}-0/{_CLUSTER_ID_FILE}")
            ):
                log.info("deleting %s: its queue was deleted", topic)
                logs.delete_topic(topic)

    # --- in a cluster ---------------------------------------------------------------------------

    def _elsewhere(self, name: str) -> bool:
        """Whether ``name`` is a transient queue another node of the cluster serves."""
        return (
            self._cluster is not None
            and name not in self._queues
            and self._cluster.transient_owner(name) >= 0
        )

    def replicate(self, cluster: QueueCluster | None) -> None:
        """Serve the durable queues as a node of a cluster (see the module docstring): the
        ones loaded from the local logs at start are forgotten until this node owns them
        (:meth:`cluster_role`). None: back to a single node's behaviour (at close)."""
        self._cluster = cluster
        self.definitions.replicate(None if cluster is None else cluster.definitions())
        if cluster is None:
            self._specs.clear()
            return
        self._specs = {s.name: s for s in self.definitions.definitions().queues}
        for q in [q for q in self._queues.values() if q.spec.durable]:
            self._forget(q)
        for name in sorted(self._specs):
            self._sync_owned(name)

    def cluster_role(self, name: str, *, leading: bool) -> None:
        """This node started (``leading``) or stopped leading a partition of durable queue
        ``name``'s topic: it takes the queue over once it leads both and knows the queue,
        and gives it up as soon as it stops leading either."""
        q = self._queues.get(name)
        if not leading:
            if q is not None and q.spec.durable:
                self._forget(q)
            return
        self._sync_owned(name)

    def definitions_copied(self, data: bytes | memoryview) -> None:
        """A follower of ``__queue_definitions`` copied ``data``: apply it (what cannot be
        applied is logged: the copy goes on)."""
        self.definitions.apply_copied(data)
        try:
            self._sync_definitions()
        except TidewireError as exc:
            log.error("queue definitions copied from the leader not all applied: %s", exc)

    def definitions_truncated(self) -> None:
        """A follower's ``__queue_definitions`` was cut: read it again."""
        self.definitions.reload()
        try:
            self._sync_definitions()
        except TidewireError as exc:
            log.error("queue definitions read again not all applied: %s", exc)

    def _sync_definitions(self) -> None:
        """Make the router and the cluster's queues match the definitions in memory (a
        follower's copy changed)."""
        if self._cluster is None:
            return
        defs = self.definitions.definitions()
        exchanges = {e.name: e for e in defs.exchanges}
        for name, e in list(self.router.exchanges.items()):
            builtin = name == DEFAULT_EXCHANGE or name.startswith("amq.")
            if e.durable and name not in exchanges and not builtin:
                self.router.remove_exchange(name)
        for e in defs.exchanges:
            if self.router.exchanges.get(e.name) != e:
                if e.name in self.router.exchanges:
                    self.router.remove_exchange(e.name)
                self.router.add_exchange(e)
        specs = {q.name: q for q in defs.queues}
        for name in [n for n in self._specs if n not in specs]:
            del self._specs[name]
            q = self._queues.get(name)
            if q is not None and q.spec.durable:
                self._forget(q, deleted=True)
            self.router.remove_destination("queue", name)
        for name, spec in specs.items():
            if self._specs.get(name) != spec:
                self._specs[name] = spec
                self._sync_owned(name)
        wanted = set(defs.bindings)
        for b in self.router.bindings():
            if b not in wanted and self._durable_binding(b):
                self.router.remove_binding(b)
        for b in defs.bindings:
            try:
                self.router.add_binding(b)
            except TidewireError as exc:
                log.warning("binding %s not applied: %s", b, exc)

    def _sync_owned(self, name: str) -> None:
        """Take durable queue ``name`` over when this node owns it and knows it (loaded from
        the local replicas of its logs, which hold everything acknowledged)."""
        cluster = self._cluster
        spec = self._specs.get(name)
        if cluster is None or spec is None or name in self._queues or not cluster.owns(name):
            return
        topic = queue_topic(name)
        plog = self.broker.logs.logs.get((topic, 0))
        slog = self.broker.logs.logs.get((topic, 1))
        if plog is None or slog is None:
            return  # its logs are being made: the next role change brings it here
        q = self._new_queue(
            spec,
            DurableMessages(plog, cluster.log_replication(topic, 0)),
            StateLog(slog, cluster.log_replication(topic, 1)),
            "",
        )
        q.recover()
        self._queues[name] = q
        log.info("queue %r served here (%d unsettled)", name, q.unsettled())
        self._wake(q)

    def _forget(self, q: Queue, *, deleted: bool = False) -> None:
        """Stop serving ``q`` here (another node owns it now, or it was deleted): its
        consumers are told they were cancelled, waiting gets answered with nothing; what they
        held is not settled, so the next owner delivers it again."""
        if not self._detach(q):
            return
        q.held.clear()
        log.info("queue %r %s", q.name, "deleted" if deleted else "no longer served here")

    async def _definitions_leader(self) -> None:
        """In a cluster: refuse a change of the durable definitions on a node that is not
        the leader of ``__queue_definitions`` before anything changes here."""
        if self._cluster is not None:
            await self._cluster.definitions().check_leader()

    async def _leads_definitions(self) -> bool:
        """Whether this node may change the durable definitions now (a cluster's leader of
        ``__queue_definitions``)."""
        try:
            await self._definitions_leader()
        except NotLeaderError:
            return False
        return True

    async def run(self) -> None:
        """Until cancelled: apply timers when due, give back settled segments and compact
        state logs every :data:`UPKEEP_S`. It sleeps until the next timer (a new earlier
        one wakes it), so a broker whose queues have nothing timed costs nothing between
        upkeeps."""
        loop = asyncio.get_running_loop()
        last_upkeep = loop.time()
        while True:
            wait = UPKEEP_S - (loop.time() - last_upkeep)
            now = self.clock()
            for q in self._queues.values():
                due = q.next_due()
                if due is not None:
                    wait = min(wait, (due - now) / 1000)
                if q.spec.message_ttl_ms or q.has_expiring():
                    wait = min(wait, TTL_SWEEP_S)
            self._timer_added.clear()
            if wait > 0:
                await wait_event(self._timer_added, max(wait, TICK_S))
            await self.tick()
            if loop.time() - last_upkeep >= UPKEEP_S:
                last_upkeep = loop.time()
                for q in list(self._queues.values()):
                    try:
                        await q.upkeep()
                    except TidewireError as exc:
                        log.warning("upkeep of queue %r failed: %s", q.name, exc)

    async def close(self) -> None:
        """Let dead-lettering under way end; record the delivery counts of what is held (so a
        clean restart counts them, where a crash does not); answer waiting gets with nothing."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for q in self._queues.values():
            if q.state is not None and q.held:  # a clean stop counts the deliveries under way
                try:
                    await q.state.write([COUNTS, [[h.offset, h.count] for h in q.held.values()]])
                except TidewireError as exc:
                    log.warning("delivery counts of queue %r not saved: %s", q.name, exc)
            for g in list(q._getters):
                if not g.future.done():  # type: ignore[attr-defined]
                    g.future.set_result(Delivery(q.name, "", (), b""))  # type: ignore[attr-defined]

    async def wait_idle(self) -> None:
        """Return once the work started in the background (dead-lettering, taking back what
        a consumer or connection held) has ended, and deliveries were handed out."""
        while self._tasks or self._scheduled:
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            await asyncio.sleep(0)

    async def tick(self) -> None:
        """Apply every queue's timers due by now (delays, visibility timeouts, TTL)."""
        now = self.clock()
        for q in list(self._queues.values()):
            due = q.next_due()
            if (due is not None and due <= now) or q.spec.message_ttl_ms or q.has_expiring():
                try:
                    await q.tick()
                except TidewireError as exc:  # one queue's failing log stops no other's timers
                    log.error("timers of queue %r: %s", q.name, exc)

    def _audit(self, action: str, resource: str, error: TidewireError | None) -> None:
        audit = self.broker.audit
        if audit is not None:
            outcome, reason = ("failed", error.message) if error is not None else ("ok", "")
            audit.event(action, outcome, resource=resource, reason=reason)

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s failed", task.get_name(), exc_info=task.exception())

    # --- definitions ----------------------------------------------------------------------------

    def _new_queue(
        self, spec: QueueSpec, messages: Any, state: StateLog | None, owner: str
    ) -> Queue:
        return Queue(
            spec,
            messages,
            state,
            clock=self.clock,
            dead_letter=self._dead_letter,
            wake=self._wake,
            timer_added=self._timer_added.set,
            owner=owner,
        )

    @_audited("EXCHANGE_DECLARE")
    async def declare_exchange(self, spec: ExchangeSpec, *, passive: bool = False) -> ExchangeSpec:
        """Make an exchange, or check the one of that name has these settings.

        Raises:
            UnknownExchangeError: ``passive`` and no such exchange.
            PreconditionFailedError: it exists with other settings.
            InvalidQueueError: a bad name or type.
        """
        existing = self.router.exchanges.get(spec.name)
        if passive:
            if existing is None:
                raise UnknownExchangeError(f"no exchange {spec.name!r}")
            return existing
        if existing is not None:
            if existing != spec:
                raise PreconditionFailedError(
                    f"exchange {spec.name!r} exists with other settings: {_diff(existing, spec)}"
                )
            return existing
        check_name("exchange", spec.name)
        if spec.durable:
            await self._definitions_leader()
        self.router.add_exchange(spec)  # validates the type
        if spec.durable:
            try:
                await self.definitions.put_exchange(spec)
            except BaseException:
                self.router.remove_exchange(spec.name)
                raise
        return spec

    @_audited("EXCHANGE_DELETE", "exchange")
    async def delete_exchange(self, name: str, *, if_unused: bool = False) -> None:
        """Delete an exchange and its bindings.

        Raises:
            UnknownExchangeError, InvalidQueueError (a built-in one),
            PreconditionFailedError (``if_unused`` and it has bindings).
        """
        spec = self.router.exchanges.get(name)
        if spec is None:
            raise UnknownExchangeError(f"no exchange {name!r}")
        if name == DEFAULT_EXCHANGE or name.startswith("amq."):
            raise InvalidQueueError(f"exchange {name!r} is built in and cannot be deleted")
        if if_unused and self.router.has_bindings(name):
            raise PreconditionFailedError(f"exchange {name!r} has bindings (if_unused)")
        if spec.durable:
            await self._definitions_leader()
        self.router.remove_exchange(name)
        if spec.durable:  # its bindings' tombstones go in the same batch
            await self.definitions.delete_exchange(name)

    @_audited("QUEUE_DECLARE")
    async def declare_queue(
        self, spec: QueueSpec, *, owner: str = "", passive: bool = False
    ) -> QueueStatus:
        """Make a queue, or check the one of that name has these settings.

        Raises:
            UnknownQueueError: ``passive`` and no such queue.
            PreconditionFailedError: it exists with other settings.
            QueueLockedError: it is exclusive to another connection.
            InvalidQueueError: a bad name or setting.
        """
        q = self._queues.get(spec.name)
        if passive:
            return self._queue(spec.name, owner).status()
        if self._cluster is not None and spec.durable:
            return await self._declare_clustered(spec)
        if self._cluster is not None and q is None:
            q = await self._claim_transient(spec)
        if q is not None:
            if q.spec != spec:
                raise PreconditionFailedError(
                    f"queue {spec.name!r} exists with other settings: {_diff(q.spec, spec)}"
                )
            self._check_owner(q, owner)
            return q.status()
        check_name("queue", spec.name)
        _check_spec(spec)
        if spec.durable:
            pending = self._declaring.get(spec.name)
            if pending is not None and pending != spec:  # another declare is being stored
                raise PreconditionFailedError(
                    f"queue {spec.name!r} is being declared with other settings: "
                    f"{_diff(pending, spec)}"
                )
            self._declaring[spec.name] = spec
            try:
                await self.definitions.put_queue(spec)
            finally:
                if self._declaring.get(spec.name) is spec:
                    del self._declaring[spec.name]
            if spec.name in self._queues:  # declared meanwhile (with these settings)
                return await self.declare_queue(spec, owner=owner)
            plog, slog = open_logs(self.broker.logs, spec.name)
            q = self._new_queue(spec, DurableMessages(plog), StateLog(slog), owner)
        else:
            q = self._new_queue(spec, MemoryMessages(), None, owner)
        self._queues[spec.name] = q
        if spec.exclusive:
            self._by_owner.setdefault(owner, set()).add(spec.name)
        return q.status()

    async def _claim_transient(self, spec: QueueSpec) -> Queue | None:
        """Before a transient queue is made here in a cluster: its name must be free in the
        cluster (no durable queue, no transient queue of another node: that node is named,
        NotLeaderError, and the client asks it). A non-exclusive one is recorded as this
        node's (:meth:`QueueCluster.claim_transient`), so that any node routes to it; an
        exclusive one stays its connection's, on this node only. Returns the queue of that
        name made here meanwhile, if any."""
        assert self._cluster is not None
        check_name("queue", spec.name)
        known = self._specs.get(spec.name)
        if known is not None:
            raise PreconditionFailedError(
                f"queue {spec.name!r} exists with other settings: {_diff(known, spec)}"
            )
        if self._elsewhere(spec.name):
            raise self._cluster.not_owner(spec.name)
        if not spec.exclusive:
            _check_spec(spec)
            await self._cluster.claim_transient(spec)
        return self._queues.get(spec.name)

    async def _declare_clustered(self, spec: QueueSpec) -> QueueStatus:
        """Declare a durable queue in a cluster (on the leader of the definitions): its topic
        is made through etcd, then its definition stored. Answered with its status where it
        is served here; elsewhere with its settings and no counts (the owner has them)."""
        known = self._specs.get(spec.name)
        if known is None:
            check_name("queue", spec.name)
            _check_spec(spec)
            if spec.name in self._queues:  # a transient queue of that name on this node
                raise PreconditionFailedError(
                    f"queue {spec.name!r} exists with other settings: "
                    f"{_diff(self._queues[spec.name].spec, spec)}"
                )
            assert self._cluster is not None
            elsewhere = self._cluster.transient_owner(spec.name)
            if elsewhere >= 0:
                raise PreconditionFailedError(
                    f"queue {spec.name!r} exists as a transient queue of node {elsewhere}"
                )
            await self._definitions_leader()
            await self._cluster.create_queue_topic(spec.name)
            await self.definitions.put_queue(spec)
            known = self._specs.setdefault(spec.name, spec)
            self._sync_owned(spec.name)
        if known != spec:
            raise PreconditionFailedError(
                f"queue {spec.name!r} exists with other settings: {_diff(known, spec)}"
            )
        q = self._queues.get(spec.name)
        return q.status() if q is not None else _unserved(spec)

    @_audited("QUEUE_DELETE")
    async def delete_queue(
        self, name: str, *, if_empty: bool = False, if_unused: bool = False, owner: str = ""
    ) -> int:
        """Delete a queue, its messages and its bindings; return how many messages it held.

        Raises:
            UnknownQueueError, QueueLockedError,
            PreconditionFailedError: ``if_empty`` and it holds messages, or ``if_unused``
                and it has consumers.
        """
        if self._cluster is not None and name in self._specs:
            return await self._delete_clustered(name, if_empty=if_empty, if_unused=if_unused)
        q = self._queue(name, owner)
        n = q.unsettled()
        if if_empty and n:
            raise PreconditionFailedError(f"queue {name!r} holds {n:,} messages (if_empty)")
        if if_unused and q.consumers:
            raise PreconditionFailedError(
                f"queue {name!r} has {len(q.consumers)} consumers (if_unused)"
            )
        await self._drop_queue(q)
        return n

    @_audited("QUEUE_DELETE")
    async def delete_for_owner(self, name: str, by: int) -> int:
        """On the leader of the definitions, the cluster's own request of node ``by``, the
        owner of durable ``auto_delete`` queue ``name`` whose last consumer left: delete it
        if it still has no consumers (asked of its owner). The node principal sending it
        holds no ``delete`` on queues: this checks that the request is what the cluster's
        logic sends, so that a node's key deletes nothing else. Returns the messages
        dropped with it.

        Raises:
            InvalidQueueError: not a cluster; UnknownQueueError: no such durable queue;
            PreconditionFailedError: not ``auto_delete``, not owned by node ``by`` now, or
            it has consumers; NotLeaderError: this node does not lead the definitions.
        """
        if self._cluster is None:
            raise InvalidQueueError(f"queue {name!r}: an owner's delete is a cluster's request")
        spec = self._specs.get(name)
        if spec is None:
            raise UnknownQueueError(f"no durable queue {name!r} in the cluster")
        if not spec.auto_delete:
            raise PreconditionFailedError(
                f"queue {name!r} is not auto_delete: node {by} may not delete it"
            )
        owner = self._cluster.owner_of(name)
        if owner != by:
            raise PreconditionFailedError(
                f"queue {name!r} is owned by node {owner}, not by node {by}, which asked to "
                "delete it"
            )
        return await self._delete_clustered(name, if_empty=False, if_unused=True)

    async def _delete_clustered(self, name: str, *, if_empty: bool, if_unused: bool) -> int:
        """Delete a durable queue in a cluster, on the leader of the definitions: its
        definition (and bindings) first, then its topic through etcd; its owner forgets it
        as the deletion reaches it. ``if_empty`` / ``if_unused`` are checked with what the
        queue holds where it is served: here, or asked of its owner."""
        await self._definitions_leader()
        assert self._cluster is not None
        q = self._queues.get(name)
        n, consumers = (q.unsettled(), len(q.consumers)) if q is not None else (0, 0)
        if q is None and (if_empty or if_unused):
            n, consumers = await self._cluster.owner_usage(name)
        if if_empty and n:
            raise PreconditionFailedError(f"queue {name!r} holds {n:,} messages (if_empty)")
        if if_unused and consumers:
            raise PreconditionFailedError(f"queue {name!r} has {consumers} consumers (if_unused)")
        await self.definitions.delete_queue(name)
        self._specs.pop(name, None)
        self.router.remove_destination("queue", name)
        if q is not None:
            self._forget(q, deleted=True)
        await self._cluster.delete_queue_topic(name)
        return n

    def _detach(self, q: Queue) -> bool:
        """Take ``q`` out of the served queues: its consumers are told they were cancelled,
        its waiting gets are answered with nothing. False: ``q`` was not served here."""
        if self._queues.get(q.name) is not q:
            return False
        del self._queues[q.name]
        self._dirty.discard(q)
        consumers, q.consumers = q.consumers, []
        for c in consumers:
            if c.cancelled is not None:
                c.cancelled()
        for g in q._getters:
            if not g.future.done():  # type: ignore[attr-defined]
                g.future.set_result(Delivery(q.name, "", (), b""))  # type: ignore[attr-defined]
        return True

    async def _drop_queue(self, q: Queue) -> None:
        if not self._detach(q):
            return
        self.router.remove_destination("queue", q.name)
        if q.spec.durable:  # the bindings to it go in the same batch
            await self.definitions.delete_queue(q.name)
            await self.broker.logs.delete_topic_async(queue_topic(q.name))
        elif self._cluster is not None:  # a transient queue: the cluster's record of it
            await self._cluster.release_transient(q.name)

    @_audited("QUEUE_PURGE")
    async def purge_queue(self, name: str, *, owner: str = "") -> int:
        """Remove every ready message of a queue; return how many.

        Raises:
            UnknownQueueError, QueueLockedError.
        """
        return await self._queue(name, owner).purge()

    @_audited("QUEUE_BIND")
    async def bind(self, b: Binding) -> None:
        """Bind (idempotent).

        Raises:
            UnknownExchangeError, UnknownQueueError, UnknownTopicError, InvalidQueueError.
        """
        self._check_destination(b)
        if self._durable_binding(b) and b not in self.router.bindings(exchange=b.exchange):
            await self._definitions_leader()
        if not self.router.add_binding(b):
            return
        if self._durable_binding(b):
            try:
                await self.definitions.put_binding(b)
            except BaseException:
                self.router.remove_binding(b)
                raise

    @_audited("QUEUE_UNBIND")
    async def unbind(self, b: Binding) -> None:
        """Remove a binding (no error when there is none)."""
        durable = self._durable_binding(b)
        if durable and b in self.router.bindings(exchange=b.exchange):
            await self._definitions_leader()
        if self.router.remove_binding(b) and durable:
            await self.definitions.delete_binding(b)

    def _check_destination(self, b: Binding) -> None:
        if b.destination_kind == "queue":
            name = b.destination
            if name not in self._queues and name not in self._specs and not self._elsewhere(name):
                raise UnknownQueueError(f"no queue {name!r}")
        elif b.destination_kind == "topic":
            if b.destination not in self.broker.topics():
                raise UnknownTopicError(f"no topic {b.destination!r}")
        else:
            raise InvalidQueueError(f"destination_kind {b.destination_kind!r}: 'queue' or 'topic'")

    def _durable_binding(self, b: Binding) -> bool:
        ex = self.router.exchanges.get(b.exchange)
        if ex is None or not ex.durable:
            return False
        if b.destination_kind == "topic":
            return True
        q = self._queues.get(b.destination)
        return (q is not None and q.spec.durable) or b.destination in self._specs

    def exchanges(self) -> list[ExchangeSpec]:
        """Every exchange, the default one included."""
        return sorted(self.router.exchanges.values(), key=lambda e: e.name)

    def bindings(
        self, *, exchange: str | None = None, destination: str | None = None
    ) -> list[Binding]:
        """The bindings, of one exchange or to one destination."""
        return self.router.bindings(exchange=exchange, destination=destination)

    def queues(self) -> list[QueueStatus]:
        """Every queue, by name (in a cluster, the durable queues and the transient ones
        other nodes serve too: their settings, with no counts)."""
        out = {n: q.status() for n, q in self._queues.items()}
        for n, spec in self._specs.items():
            if n not in out:
                out[n] = _unserved(spec)
        if self._cluster is not None:
            for n, spec in self._cluster.transient_specs().items():
                out.setdefault(n, _unserved(spec))
        return [out[n] for n in sorted(out)]

    def describe_queue(self, name: str) -> QueueStatus:
        """One queue.

        Raises:
            UnknownQueueError.
        """
        return self._queue(name, None).status()

    def _queue(self, name: str, owner: str | None) -> Queue:
        q = self._queues.get(name)
        if q is None:
            if self._cluster is not None and (name in self._specs or self._elsewhere(name)):
                raise self._cluster.not_owner(name)
            raise UnknownQueueError(f"no queue {name!r}")
        if owner is not None:
            self._check_owner(q, owner)
        return q

    @staticmethod
    def _check_owner(q: Queue, owner: str) -> None:
        if q.spec.exclusive and q.owner != owner:
            raise QueueLockedError(f"queue {q.name!r} is exclusive to another connection")

    # --- publishing -----------------------------------------------------------------------------

    async def publish(
        self,
        exchange: str,
        routing_key: str,
        data: bytes | memoryview,
        *,
        headers: Mapping[str, str] | None = None,
        mandatory: bool = False,
        ttl_ms: int = 0,
        deliver_at_ms: int = 0,
        owner: str = "",
        forward: bool = False,
    ) -> PublishResult:
        """Route the batches in ``data`` through ``exchange`` and store them in every queue
        and topic the route reaches; return once stored (durable queues: fsynced).

        In a cluster, the parts for durable queues served by other nodes are forwarded to
        their owners (confirmed once every owner confirmed), except a publish through the
        default exchange to one such queue, answered NotLeaderError naming its owner (the
        client sends it there) unless ``forward`` (the broker's own publishes).

        Raises:
            UnknownExchangeError, UnroutableError (``mandatory``, no route), QueueFullError
            (a queue at its limit under reject-publish: nothing is stored anywhere),
            RecordBatchError, BatchTooLargeError, InvalidQueueError (a negative TTL).
        """
        if ttl_ms < 0 or deliver_at_ms < 0:
            raise InvalidQueueError(
                f"ttl_ms={ttl_ms} and deliver_at_ms={deliver_at_ms} must be >= 0"
            )
        view = memoryview(data)
        checked = self.broker.split_batches(view)
        route = self.router.route(exchange, routing_key, headers or {})
        queues = [self._queues[n] for n in route.queues if n in self._queues]
        remote: list[str] = []
        if self._cluster is not None:
            remote = [
                n
                for n in route.queues
                if n not in self._queues and (n in self._specs or self._elsewhere(n))
            ]
            # Through the default exchange to one queue served elsewhere: the client goes
            # there itself.
            alone = len(remote) == 1 and not queues and not route.topics
            if alone and not forward and exchange == DEFAULT_EXCHANGE:
                raise self._cluster.not_owner(remote[0])
        if not queues and not route.topics and not remote:
            if mandatory:
                raise UnroutableError(
                    f"exchange {exchange!r} routes {routing_key!r} nowhere (mandatory)"
                )
            return PublishResult(unroutable=True)
        n = sum(h.records_count for _, _, h in checked)
        for q in queues:
            q.check_room(n, len(view))
        pairs: list[tuple[memoryview, BatchHeader]] = [(view[s:e], h) for s, e, h in checked]
        jobs: list[Coroutine[Any, Any, Any]] = [
            q.publish(pairs, ttl_ms=ttl_ms, deliver_at_ms=deliver_at_ms) for q in queues
        ]
        jobs += [self._to_topic(t, routing_key, view) for t in route.topics]
        if remote:
            assert self._cluster is not None
            raw = bytes(view)
            jobs += [
                self._cluster.forward(n, raw, ttl_ms=ttl_ms, deliver_at_ms=deliver_at_ms)
                for n in remote
            ]
        results = await asyncio.gather(*jobs)
        topics = tuple(r for r in results[len(queues) : len(queues) + len(route.topics)])
        names = tuple(q.name for q in queues) + tuple(remote)
        return PublishResult(queues=names, topics=topics)

    async def _to_topic(
        self, topic: str, routing_key: str, view: memoryview
    ) -> tuple[str, int, int]:
        """Append to a topic bound to an exchange: the partition is chosen by the routing key."""
        parts = self.broker.partition_count(topic)
        p = zlib.crc32(routing_key.encode()) % parts if parts > 1 else 0
        r = await self.broker.produce(topic, p, view)
        return (topic, p, r.base_offset)

    # --- delivery -------------------------------------------------------------------------------

    def _wake(self, q: Queue) -> None:
        self._dirty.add(q)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._dispatch)

    def _dispatch(self) -> None:
        self._scheduled = False
        dirty, self._dirty = self._dirty, set()
        for q in dirty:
            if self._queues.get(q.name) is q:
                try:
                    q.dispatch()
                except TidewireError as exc:  # a read failed: try again on the next wake
                    log.error("delivering from queue %r failed: %s", q.name, exc)

    def consume(
        self,
        queue: str,
        *,
        owner: str,
        prefetch: int,
        deliver: Callable[[Delivery], None],
        consumer_tag: str = "",
        cancelled: Callable[[], None] | None = None,
    ) -> str:
        """Start a push consumer; return its tag. ``deliver`` is called on the loop with at
        most ``prefetch`` unsettled messages at any time; ``cancelled`` if the consumer ends
        without having asked (its queue was deleted), as AMQP's ``basic.cancel``.

        Raises:
            UnknownQueueError, QueueLockedError, InvalidQueueError (prefetch out of range),
            PreconditionFailedError (a consumer tag in use).
        """
        q = self._queue(queue, owner)
        if not 1 <= prefetch <= MAX_PREFETCH:
            raise InvalidQueueError(f"prefetch={prefetch:,} must be within 1..{MAX_PREFETCH:,}")
        tag = consumer_tag or f"ctag-{next(self._ctags)}"
        if any(c.tag == tag for c in q.consumers):
            raise PreconditionFailedError(f"consumer tag {tag!r} is in use on queue {queue!r}")
        q.add_consumer(Consumer(tag, owner, prefetch, deliver, cancelled=cancelled))
        self._by_owner.setdefault(owner, set()).add(queue)
        return tag

    def cancel(self, queue: str, consumer_tag: str) -> None:
        """Stop a consumer; what it holds is taken back (redelivered first)."""
        q = self._queues.get(queue)
        if q is None:
            return
        for c in q.consumers:
            if c.tag == consumer_tag:
                self._spawn(self._remove_consumer(q, c), f"cancel {consumer_tag} on {queue}")
                return

    async def _remove_consumer(self, q: Queue, c: Consumer) -> None:
        try:
            await q.remove_consumer(c)
        except NotLeaderError as exc:  # a cluster's queue moving: its next owner redelivers
            log.info("consumer %s of queue %r removed as the queue moved: %s", c.tag, q.name, exc)
            return
        if q.spec.auto_delete and q.had_consumers and not q.consumers:
            if self._cluster is not None and q.spec.durable:
                try:  # deleted by the definitions' leader, as any delete
                    if await self._leads_definitions():
                        await self._delete_clustered(q.name, if_empty=False, if_unused=False)
                    else:  # which checks with this node, the owner, that it is still unused
                        await self._cluster.delete_at_definitions_leader(q.name)
                except TidewireError as exc:
                    log.warning("queue %r (auto_delete) kept: %s", q.name, exc.message)
                return
            await self._drop_queue(q)

    async def get(
        self,
        queue: str,
        *,
        owner: str,
        max_messages: int = 1,
        wait_ms: int = 0,
        visibility_timeout_ms: int | None = None,
    ) -> Delivery:
        """Take up to ``max_messages`` ready messages for ``owner``, waiting up to ``wait_ms``
        for the first; held until settled, until ``visibility_timeout_ms`` passes (default:
        the queue's), or until ``connection_closed(owner)``.

        Raises:
            UnknownQueueError, QueueLockedError, InvalidQueueError.
        """
        q = self._queue(queue, owner)
        if not 1 <= max_messages <= MAX_GET:
            raise InvalidQueueError(f"max_messages={max_messages:,} must be within 1..{MAX_GET:,}")
        vt = (
            q.spec.visibility_timeout_ms if visibility_timeout_ms is None else visibility_timeout_ms
        )
        if vt < 0 or wait_ms < 0:
            raise InvalidQueueError(
                f"visibility_timeout_ms={vt} and wait_ms={wait_ms} must be >= 0"
            )
        self._by_owner.setdefault(owner, set()).add(queue)
        d = q.get_now(owner, max_messages, vt)
        if d.entries or wait_ms <= 0:
            return d
        fut: asyncio.Future[Delivery] = asyncio.get_running_loop().create_future()
        g = q.new_getter(owner, max_messages, vt, fut)
        q.add_getter(g)
        try:
            await asyncio.wait({fut}, timeout=wait_ms / 1000)
        except asyncio.CancelledError:
            q.remove_getter(g)
            if fut.done() and not fut.cancelled():  # handed out as the caller went: back
                tags = {e.tag for e in fut.result().entries}
                self._spawn(
                    q.requeue(q.release_owner_gets(owner, tags), durable=False),
                    f"requeue a cancelled get on {queue}",
                )
            fut.cancel()
            raise
        q.remove_getter(g)
        if fut.done() and not fut.cancelled():
            return fut.result()
        fut.cancel()
        return Delivery(q.name, "", (), b"")

    async def settle(
        self,
        queue: str,
        tags: Sequence[int],
        outcome: SettleOutcome,
        *,
        owner: str,
        up_to: int = 0,
    ) -> None:
        """Settle deliveries ``owner`` holds: ``ack``, ``requeue`` (redelivered first) or
        ``dead-letter`` (reject / nack without requeue); return once recorded durably.

        Raises:
            UnknownQueueError; UnknownDeliveryTagError naming the tags ``owner`` does not
            hold (the others are settled all the same); InvalidQueueError (a bad outcome).
        """
        q = self._queue(queue, None)
        if outcome not in ("ack", "requeue", "dead-letter"):
            raise InvalidQueueError(f"outcome {outcome!r}: 'ack', 'requeue' or 'dead-letter'")
        if q.state is not None and q.state.replication is not None:
            # In a cluster: refused (too few in-sync replicas, or no longer led here) before
            # anything changes, so that what is held stays held.
            q.state.replication.check_leader()
        found, unknown = q.find_held(tags, owner, up_to)
        if outcome == "ack":
            await q.ack(found)
        elif outcome == "requeue":
            await q.requeue(found)
        else:
            # Answered once the dead letters are stored and their settlement is recorded,
            # like an ack: a reject confirmed before that could come back after a crash.
            # Shielded: a request given up on does not stop the dead-lettering half-way.
            await asyncio.shield(q.reject(found))
        if unknown:
            shown = ", ".join(str(t) for t in unknown[:5])
            more = f" and {len(unknown) - 5:,} more" if len(unknown) > 5 else ""
            raise UnknownDeliveryTagError(
                f"{len(unknown):,} delivery tag(s) not held by this connection on queue "
                f"{queue!r}: {shown}{more}"
            )

    def connection_closed(self, owner: str) -> None:
        """``owner`` went: its consumers stop, what it holds is taken back, its exclusive
        queues are deleted."""
        names = self._by_owner.pop(owner, set())
        for name in names:
            q = self._queues.get(name)
            if q is None:
                continue
            if q.spec.exclusive and q.owner == owner:
                self._spawn(self._drop_queue(q), f"delete exclusive queue {name}")
                continue
            for c in [c for c in q.consumers if c.owner == owner]:
                self._spawn(self._remove_consumer(q, c), f"cancel {c.tag} on {name}")
            gets = q.release_owner_gets(owner)
            if gets:
                self._spawn(q.requeue(gets, durable=False), f"requeue gets on {name}")

    # --- dead letters ---------------------------------------------------------------------------

    def _dead_letter(
        self, q: Queue, pairs: list[tuple[int, int]], reason: DeathReason
    ) -> asyncio.Task[None]:
        return self._spawn(self._send_dead(q, pairs, reason), f"dead-letter from {q.name}")

    async def _send_dead(self, q: Queue, pairs: list[tuple[int, int]], reason: DeathReason) -> None:
        """Publish messages leaving ``q`` to its dead-letter exchange with ``x-death``, then
        settle them; without a dead-letter exchange (or a route) they are dropped."""
        offsets = [o for o, _ in pairs]
        dlx = q.spec.dead_letter_exchange
        sent = False
        if dlx is not None:
            try:
                sent = await self._republish_dead(q, pairs, reason, dlx)
            except TidewireError as exc:
                if self._cluster is not None and exc.retriable and self._queues.get(q.name) is q:
                    # A queue of the exchange is served by a node not reached now (moving,
                    # or too few in-sync replicas there): kept, not dropped; tried again.
                    log.warning(
                        "dead letters of queue %r kept: exchange %r did not take them (%s); "
                        "they leave again when next due",
                        q.name,
                        dlx,
                        exc,
                    )
                    q.undie(pairs)
                    return
                log.warning(
                    "dead letters of queue %r could not go to exchange %r (%s): dropped",
                    q.name,
                    dlx,
                    exc,
                )
        await q.settle_dead(offsets, dead_lettered=sent)

    async def _republish_dead(
        self, q: Queue, pairs: list[tuple[int, int]], reason: DeathReason, dlx: str
    ) -> bool:
        now = self.clock()
        by_key: dict[str, BatchBuilder] = {}
        for o, count in pairs:
            ts, key, value, headers = q.messages.record(o)
            rk = key.decode(errors="replace") if key else ""
            death = _Death(q.name, reason, rk, count, now)
            out_key = q.spec.dead_letter_routing_key or rk
            b = by_key.get(out_key)
            if b is None:
                b = by_key[out_key] = BatchBuilder()
            b.append(value, timestamp_ms=ts, key=key, headers=_with_death(headers, death))
        routed = False
        for rk, b in by_key.items():
            r = await self.publish(dlx, rk, b.build(), forward=True)
            routed = routed or not r.unroutable
        return routed

    def browse(self, queue: str, *, from_offset: int = 0, max_messages: int = 100) -> Delivery:
        """Ready messages of ``queue`` from ``from_offset``, without delivering them.

        Raises:
            UnknownQueueError, InvalidQueueError.
        """
        if not 1 <= max_messages <= MAX_GET:
            raise InvalidQueueError(f"max_messages={max_messages:,} must be within 1..{MAX_GET:,}")
        return self._queue(queue, None).browse(from_offset, max_messages)

    @_audited("QUEUE_REPLAY")
    async def replay(
        self,
        queue: str,
        *,
        offsets: Sequence[int] | None = None,
        from_offset: int = 0,
        to_offset: int | None = None,
    ) -> int:
        """Move dead letters back to the queue their newest ``x-death`` entry names (through
        the default exchange, headers kept); return how many moved. Messages without
        ``x-death``, or whose queue is gone, stay.

        Raises:
            UnknownQueueError.
        """
        q = self._queue(queue, None)
        if offsets is None:
            end = q.end if to_offset is None or to_offset < 0 else min(to_offset, q.end)
            wanted = [o for o in q.ready_offsets(from_offset, MAX_REPLAY) if o < end]
        else:
            wanted = sorted(set(offsets))[:MAX_REPLAY]
        taken = await q.take_for_replay(wanted)
        moved: list[int] = []
        stay: list[int] = []
        batches: dict[str, tuple[BatchBuilder, list[int]]] = {}
        for o in taken:
            ts, key, value, headers = q.messages.record(o)
            target = _death_queue(headers)
            known = target is not None and (target in self._queues or target in self._specs)
            if target is None or not known or target == queue:
                stay.append(o)
                continue
            b, offs = batches.setdefault(target, (BatchBuilder(), []))
            b.append(value, timestamp_ms=ts, key=key, headers=headers)
            offs.append(o)
        try:
            for target, (b, offs) in batches.items():
                try:
                    await self.publish(DEFAULT_EXCHANGE, target, b.build(), forward=True)
                except TidewireError as exc:
                    log.warning("replay to queue %r failed: %s", target, exc)
                    stay.extend(offs)
                else:
                    moved.extend(offs)
        finally:
            q.unmove(stay)
            await q.settle_moved(moved)
        return len(moved)


@dataclass(frozen=True, slots=True)
class _Death:
    queue: str
    reason: str
    routing_key: str
    delivery_count: int
    time_ms: int


def _with_death(
    headers: tuple[tuple[str, bytes | None], ...], death: _Death
) -> list[tuple[str, bytes | None]]:
    """``headers`` with the ``x-death`` entry for ``(queue, reason)`` added or counted up
    (newest first), and ``x-first-death-*`` set the first time."""
    queue, reason, now = death.queue, death.reason, death.time_ms
    deaths: list[dict[str, Any]] = []
    out: list[tuple[str, bytes | None]] = []
    for k, v in headers:
        if k == DEATH_HEADER and v:
            try:
                parsed = json.loads(v)
                if isinstance(parsed, list):
                    deaths = [d for d in parsed if isinstance(d, dict)]
            except ValueError:
                pass
        else:
            out.append((k, v))
    for i, old in enumerate(deaths):
        if old.get("queue") == queue and old.get("reason") == reason:
            d = deaths.pop(i)
            d["count"] = int(d.get("count", 0)) + 1
            d["time_ms"] = now
            d["delivery_count"] = death.delivery_count
            deaths.insert(0, d)
            break
    else:
        deaths.insert(
            0,
            {
                "queue": queue,
                "reason": reason,
                "count": 1,
                "routing_key": death.routing_key,
                "delivery_count": death.delivery_count,
                "time_ms": now,
            },
        )
    names = {k for k, _ in out}
    if "x-first-death-queue" not in names:
        out.append(("x-first-death-queue", queue.encode()))
        out.append(("x-first-death-reason", reason.encode()))
    out.append((DEATH_HEADER, json.dumps(deaths, separators=(",", ":")).encode()))
    return out


def _death_queue(headers: tuple[tuple[str, bytes | None], ...]) -> str | None:
    """The queue named by the newest ``x-death`` entry, if any."""
    for k, v in headers:
        if k == DEATH_HEADER and v:
            try:
                deaths = json.loads(v)
            except ValueError:
                return None
            if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict):
                q = deaths[0].get("queue")
                return q if isinstance(q, str) else None
    return None


def _unserved(spec: QueueSpec) -> QueueStatus:
    """A queue another node of the cluster serves: its settings, no counts."""
    return QueueStatus(spec=spec, ready=0, unacked=0, delayed=0, bytes=0, consumers=0)


def _check_spec(spec: QueueSpec) -> None:
    """Refuse settings out of range, naming them."""
    for f in (
        "max_deliveries",
        "message_ttl_ms",
        "max_length",
        "max_length_bytes",
        "visibility_timeout_ms",
    ):
        v = getattr(spec, f)
        if v < 0:
            raise InvalidQueueError(f"{f}={v} must be >= 0 (0: none)")
    if spec.overflow not in OVERFLOW_POLICIES:
        raise InvalidQueueError(
            f"overflow={spec.overflow!r}: one of {', '.join(OVERFLOW_POLICIES)}"
        )
    if spec.exclusive and spec.durable:
        raise InvalidQueueError(f"queue {spec.name!r}: an exclusive queue cannot be durable")
    if spec.dead_letter_exchange:
        check_name("dead_letter_exchange", spec.dead_letter_exchange, reserved_ok=True)


def _diff(old: object, new: object) -> str:
    """The settings that differ, as ``name: old -> new``."""
    out = []
    for f in fields(old):  # type: ignore[arg-type]
        a, b = getattr(old, f.name), getattr(new, f.name)
        if a != b:
            out.append(f"{f.name}: {a!r} -> {b!r}")
    return ", ".join(out)
