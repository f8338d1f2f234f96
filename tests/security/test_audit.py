"""The audit log: events durable in ``__audit`` across a restart, queries with filters, memory
bounded under a flood (with summaries that add up), API keys redacted before anything is
stored, retention, and the admin APIs audited through the binary protocol."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import tracemalloc
from pathlib import Path

import pytest

from tests.server._support import serve
from tidewire.broker import Broker, BrokerConfig
from tidewire.client import AsyncClient
from tidewire.errors import InvalidRequestError, TidewireError, UnknownTopicError
from tidewire.security._logs import AUDIT_TOPIC
from tidewire.security.audit import (
    MAX_FIELD_CHARS,
    MAX_SUMMARIES,
    Actor,
    AuditEvent,
    AuditLog,
    current_actor,
    redact,
)
from tidewire.storage import LogManager
from tidewire.storage.faultfs import FaultFS

T0 = 1_800_000_000_000
HOUR = 3600 * 1000
DAY = 24 * HOUR
KEY_ID = "3f9a0c1d2e4b"
SECRET = "Zq9-Xr_4kLmN0pQrStUvWxYz12345678"
KEY = f"twk_{KEY_ID}_{SECRET}"


def event(i: int = 0, **fields: object) -> AuditEvent:
    doc: dict[str, object] = {
        "time_ms": T0 + i,
        "principal": "alice",
        "source": "10.0.0.7:5000",
        "interface": "binary",
        "action": "CREATE_TOPIC",
        "resource": f"topic:t{i}",
        "outcome": "ok",
    }
    doc.update(fields)
    return AuditEvent(**doc)  # type: ignore[arg-type]


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def data_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


# --- redaction ----------------------------------------------------------------------------------


def test_redact_replaces_keys_by_their_id() -> None:
    assert redact(f"wrong API key {KEY} from x") == f"wrong API key [key {KEY_ID}] from x"
    assert redact(f"{KEY.upper()},next") == f"[key {KEY_ID}],next"
    assert redact("twk_") == "[redacted]"
    assert redact("twk_notakey") == "[redacted]"
    assert redact(f'"{KEY}"') == f'"[key {KEY_ID}]"'
    assert redact("key id 3f9a0c1d2e4b revoked") == "key id 3f9a0c1d2e4b revoked"
    long = redact("x" * 10_000)
    assert len(long) <= MAX_FIELD_CHARS
    assert long.endswith("more)")


def test_an_event_cannot_hold_a_key_in_any_field() -> None:
    e = AuditEvent(
        time_ms=T0,
        principal=KEY,
        source=KEY,
        interface="binary",
        action=KEY,
        resource=f"principal:{KEY}",
        outcome="failed",
        reason=f"wrong API key {KEY}",
        detail={KEY: KEY, "key": f"Bearer {KEY}"},
    )
    for text in (
        e.principal,
        e.source,
        e.action,
        e.resource,
        e.reason,
        *e.detail,
        *e.detail.values(),
    ):
        assert text is not None
        assert SECRET not in text
        assert "twk_" not in text.lower()
    assert e.reason == f"wrong API key [key {KEY_ID}]"
    assert e.detail["key"] == f"Bearer [key {KEY_ID}]"


def test_a_key_never_reaches_the_disk(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(BrokerConfig(str(tmp_path))) as broker:
            audit = broker.audit
            assert audit is not None
            for i in range(50):
                audit.record(event(i, principal=KEY, outcome="failed", reason=f"bad key {KEY}"))
                audit.event(
                    "authenticate", "failed", reason=f"wrong API key {KEY}", detail={"k": KEY}
                )
            got = await audit.query(principal=f"[key {KEY_ID}]")
            assert len(got) == 50
        raw = data_bytes(tmp_path)
        assert b"wrong API key" in raw  # the events are there ...
        assert SECRET.encode() not in raw  # ... the key is not
        assert b"twk_" not in raw.lower()

    asyncio.run(main())


# --- durability and queries -------------------------------------------------------------------


def test_events_survive_a_restart(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(BrokerConfig(str(tmp_path))) as broker:
            assert broker.audit is not None
            for i in range(10):
                broker.audit.record(event(i))
            # close writes what is buffered, whether or not the writer ran meanwhile
        async with Broker(BrokerConfig(str(tmp_path))) as broker:
            assert broker.audit is not None
            got = await broker.audit.query()
            assert got == [event(i) for i in range(10)]
            broker.audit.record(event(10))
        async with Broker(BrokerConfig(str(tmp_path))) as broker:
            assert broker.audit is not None
            assert [e.time_ms for e in await broker.audit.query()] == [T0 + i for i in range(11)]
            assert "__audit" not in broker.topics()  # internal: not listed to clients

    asyncio.run(main())


def test_the_writer_writes_without_being_asked(tmp_path: Path) -> None:
    async def main() -> None:
        async with LogManager(str(tmp_path)) as logs:
            audit = AuditLog(logs, -1, flush_interval_s=0.01)
            audit.start()
            audit.record(event(1))
            for _ in range(3000):  # the writer's interval is 10 ms; allow a slow machine
                plog = logs.logs.get((AUDIT_TOPIC, 0))
                if plog is not None and plog.log_end_offset:
                    break
                await asyncio.sleep(0.01)
            assert plog is not None
            assert plog.log_end_offset == 1
            await audit.close()

    asyncio.run(main())


def test_query_filters(tmp_path: Path) -> None:
    async def main() -> None:
        async with LogManager(str(tmp_path)) as logs:
            audit = AuditLog(logs, -1)
            audit.start()
            rows = [
                ("alice", "CREATE_TOPIC", "ok"),
                ("bob", "PRODUCE", "denied"),
                (None, "authenticate", "failed"),
                ("alice", "DELETE_TOPIC", "failed"),
                ("bob", "PRODUCE", "allowed"),
            ]
            for i in range(100):
                p, a, o = rows[i % len(rows)]
                audit.record(event(i * 10, principal=p, action=a, outcome=o))

            async def q(**kw: object) -> list[tuple[int, str | None, str, str]]:
                got = await audit.query(**kw)  # type: ignore[arg-type]
                return [(e.time_ms - T0, e.principal, e.action, e.outcome) for e in got]

            every = await q()
            assert len(every) == 100
            assert [t for t, *_ in every] == sorted(t for t, *_ in every)  # newest last
            assert {x[1] for x in await q(principal="alice")} == {"alice"}
            assert len(await q(principal="alice")) == 40
            assert [x[1] for x in await q(principal="")] == [None] * 20  # anonymous
            assert len(await q(principal="carol")) == 0
            assert len(await q(outcome="denied")) == 20
            assert len(await q(action="PRODUCE")) == 40
            assert len(await q(action="PRODUCE", outcome="allowed", principal="bob")) == 20
            window = await q(since_ms=T0 + 100, until_ms=T0 + 200)
            assert [t for t, *_ in window] == list(range(100, 200, 10))
            assert await q(since_ms=T0 + 10**9) == []
            newest = await q(limit=3)
            assert [t for t, *_ in newest] == [970, 980, 990]  # the newest, oldest first
            newest_denied = await q(outcome="denied", limit=2)
            assert [t for t, *_ in newest_denied] == [910, 960]
            with pytest.raises(InvalidRequestError, match=r"limit=0 must be within 1\.\.10,000"):
                await audit.query(limit=0)
            with pytest.raises(InvalidRequestError, match="until=1 is before since=2"):
                await audit.query(since_ms=2, until_ms=1)
            await audit.close()

    asyncio.run(main())


def test_queries_and_retention_over_many_segments(tmp_path: Path) -> None:
    """Segments roll by age (a day); the newest events are found in the last segments;
    retention deletes the segments older than it, never the newest."""
    clock = Clock(T0)

    async def main() -> None:
        async with LogManager(str(tmp_path), clock=clock) as logs:
            audit = AuditLog(logs, 3 * DAY, clock=clock)
            audit.start()
            for day in range(6):
                clock.now = T0 + day * DAY + HOUR
                for i in range(20):
                    audit.event("CREATE_TOPIC", "ok", resource=f"topic:d{day}-{i}")
                await audit.flush()
            plog = logs.logs[(AUDIT_TOPIC, 0)]
            assert plog.segment_count == 6
            got = await audit.query(limit=25)
            assert [e.resource for e in got] == [f"topic:d4-{i}" for i in range(15, 20)] + [
                f"topic:d5-{i}" for i in range(20)
            ]
            day2 = await audit.query(since_ms=T0 + 2 * DAY, until_ms=T0 + 3 * DAY)
            assert [e.resource for e in day2] == [f"topic:d2-{i}" for i in range(20)]

            deleted = logs.apply_retention(clock.now)
            # Older than 3 days at day 5 + 1h: the segments of days 0, 1 (day 2 is 3 days old
            # to the hour, not older).
            assert len(deleted[(AUDIT_TOPIC, 0)]) == 2
            every = await audit.query(limit=10_000)
            assert {e.resource.split("-")[0] for e in every} == {
                f"topic:d{d}" for d in (2, 3, 4, 5)
            }
            assert len(every) == 80
            await audit.close()

    asyncio.run(main())


def test_retention_is_the_brokers_setting(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(BrokerConfig(str(tmp_path)), audit_retention_ms=7 * DAY) as broker:
            assert (AUDIT_TOPIC, 0) not in broker.logs.logs  # made by the first event
            assert broker.audit is not None
            assert await broker.audit.query() == []
            broker.audit.record(event())
            assert await broker.audit.query() == [event()]
            assert broker.logs.logs[(AUDIT_TOPIC, 0)].config.retention_ms == 7 * DAY
        async with Broker(BrokerConfig(str(tmp_path)), audit_retention_ms=-1) as broker:
            assert broker.logs.logs[(AUDIT_TOPIC, 0)].config.retention_ms == -1

    asyncio.run(main())


# --- floods -------------------------------------------------------------------------------------


def test_a_flood_costs_bounded_memory_and_the_counts_add_up(tmp_path: Path) -> None:
    """100,000 failed logins recorded faster than anything is written (no await between
    them): at most max_pending events and MAX_SUMMARIES + 1 summaries are kept, and what is
    written accounts for every one of them."""
    flood = 100_000
    max_pending = 1000

    async def main() -> None:
        async with LogManager(str(tmp_path)) as logs:
            audit = AuditLog(logs, -1, max_pending=max_pending)
            audit.start()
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            for i in range(flood):
                # 50 connections; principals made up by the attacker, ever new after a while
                audit.record(
                    AuditEvent(
                        time_ms=T0 + i,
                        principal=f"user{i % 3000}",
                        source=f"10.9.8.7:{40000 + i % 50}",
                        interface="binary",
                        action="authenticate",
                        outcome="failed",
                        reason="wrong API key",
                    )
                )
            grown = tracemalloc.get_traced_memory()[0] - before
            tracemalloc.stop()
            assert audit.pending <= max_pending + MAX_SUMMARIES + 1
            assert audit.recorded == flood
            assert audit.suppressed == flood - max_pending
            # ~1 KB per kept event or summary at the very most; 100,000 events kept would be
            # far more
            assert grown < (max_pending + MAX_SUMMARIES + 1) * 1024, grown
            await audit.close()
            got = await _read_all(logs)
            plain = [e for e in got if "suppressed" not in e.detail]
            summaries = [e for e in got if "suppressed" in e.detail]
            assert len(plain) == max_pending
            assert len(summaries) == MAX_SUMMARIES + 1
            assert len(plain) + sum(int(e.detail["suppressed"]) for e in summaries) == flood
            alike = [e for e in summaries if e.principal is not None]
            assert all(
                e.reason.endswith("more like this suppressed (the audit buffer was full)")
                for e in alike
            )
            [others] = [e for e in summaries if e.principal is None]
            assert others.action == "*"

    asyncio.run(main())


async def _read_all(logs: LogManager) -> list[AuditEvent]:
    audit = AuditLog(logs, -1)
    audit.start()
    try:
        return await audit.query(limit=10_000)
    finally:
        await audit.close()


# --- the admin APIs, through the binary protocol ----------------------------------------------


def test_admin_apis_are_audited_and_readable_with_describe_audit(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            serve(tmp_path) as (broker, server),
            AsyncClient(f"127.0.0.1:{server.port}") as c,
        ):
            await c.create_topic("orders", 2)
            await c.alter_topic("orders", partitions=3)
            with pytest.raises(UnknownTopicError):
                await c.delete_topic("nope")
            await c.repair_topic("orders")
            await c.delete_topic("orders")
            got = await c.describe_audit()
            assert [(e.action, e.resource, e.outcome) for e in got] == [
                ("CREATE_TOPIC", "topic:orders", "ok"),
                ("ALTER_TOPIC", "topic:orders", "ok"),
                ("DELETE_TOPIC", "topic:nope", "failed"),
                ("REPAIR_TOPIC", "topic:orders", "ok"),
                ("DELETE_TOPIC", "topic:orders", "ok"),
            ]
            assert all(e.principal is None and e.interface == "binary" for e in got)
            assert "nope" in got[2].reason
            assert got[3].detail == {"action": "report"}
            failed = await c.describe_audit(outcome="failed", action="DELETE_TOPIC")
            assert [e.resource for e in failed] == ["topic:nope"]
            assert len(await c.describe_audit(limit=2)) == 2
            with pytest.raises(InvalidRequestError, match="limit=20,000"):
                await c.describe_audit(limit=20_000)
            # the gate sets who the request comes from; an event takes it
            assert broker.audit is not None
            token = current_actor.set(Actor("alice", "10.1.2.3:4567", "http"))
            try:
                broker.audit.event("acl.add", "ok", resource="topic:orders")
            finally:
                current_actor.reset(token)
            [e] = await c.describe_audit(principal="alice")
            assert (e.source, e.interface, e.action) == ("10.1.2.3:4567", "http", "acl.add")

    asyncio.run(main())


def test_group_admin_apis_are_audited(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), AsyncClient(f"127.0.0.1:{server.port}") as c:
            await c.create_topic("t", 1)
            await c.commit_offsets("g", {("t", 0): 0})
            await c.reset_group_offsets("g", "t", "earliest", dry_run=True)
            await c.delete_group("g")
            got = await c.describe_audit(since_ms=0)
            assert [(e.action, e.resource, e.outcome) for e in got][1:] == [
                ("RESET_OFFSETS", "group:g", "ok"),
                ("DELETE_GROUP", "group:g", "ok"),
            ]
            assert got[1].detail == {"topic": "t", "to": "earliest", "dry_run": "true"}

    asyncio.run(main())


def test_failed_writes_keep_the_events_in_bounded_memory() -> None:
    """A disk that refuses every write: the events stay buffered (as summaries beyond
    max_pending) however often the write is tried, and nothing is counted twice."""
    fs = FaultFS()

    async def main() -> None:
        async with LogManager("/data", fs=fs) as logs:
            audit = AuditLog(logs, -1, max_pending=100)
            audit.start()
            audit.record(event(0))  # creates the log
            fs.fail_kinds.update(write=errno.ENOSPC)
            for i in range(1, 5000):
                audit.record(event(i, principal=f"p{i % 2000}", outcome="failed"))
            for _ in range(5):
                with pytest.raises(TidewireError):
                    await audit.flush()
                assert audit.pending <= 100 + MAX_SUMMARIES + 1
                kept = len(audit._pending) + sum(s.count for s in audit._summaries.values())
                assert kept == 5000
            fs.fail_kinds.clear()
            with contextlib.suppress(TidewireError):  # the failed log may stay failed
                await audit.close()

    asyncio.run(main())
