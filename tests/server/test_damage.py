"""Damage in the middle of a partition's log, through every interface of a running broker.

One byte of one batch in the first segment of a topic of several segments is flipped while the
broker is stopped. Then: reads below the damage are served, a read at it gets the specific
error with the damaged range, the batches after it (same segment and later ones) are served,
a consumer with ``skip_damaged`` reads everything else and reports the gap, writes go on,
``topic describe``, ``health`` and HTTP show the damage (HTTP answers 422 with the range, not
500), and ``topic repair`` quarantines or (confirmed) truncates it. A partition whose
``log.json`` is unreadable is offline while the rest of the broker serves.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.cli._support import run_cli
from tests.http._support import served
from tidewire.broker import Broker, BrokerConfig
from tidewire.client import AsyncClient, AsyncConsumer, AsyncGroupConsumer, Gap, Message
from tidewire.errors import PartitionCorruptError, PartitionOfflineError
from tidewire.records import BatchBuilder, iter_batches
from tidewire.storage import LogConfig

T0 = 1_700_000_000_000
N = 40  # records, one per batch
VICTIM = 5  # the offset whose batch is damaged: in the first segment, with more after it
TIMEOUT_S = 30


@dataclass(frozen=True)
class Damaged:
    data_dir: Path
    segment: Path  # the .log file holding the damaged batch
    position: int  # its byte position
    size: int  # its size
    original: bytes  # the segment's bytes before the flip


def value(i: int) -> bytes:
    return f"record {i:03d} ".encode() + b"x" * 80


def write_topic(data_dir: Path) -> None:
    async def main() -> None:
        async with Broker(BrokerConfig(data_dir=str(data_dir))) as b:
            b.create_topic("t", 1, LogConfig(segment_bytes=2048))
            b.create_topic("u", 1)
            for i in range(N):
                builder = BatchBuilder()
                builder.append(value(i), timestamp_ms=T0 + i)
                await b.produce("t", 0, builder.build())
            builder = BatchBuilder()
            builder.append(b"healthy", timestamp_ms=T0)
            await b.produce("u", 0, builder.build())
            assert len(b.log("t", 0).segment_bases) >= 3

    asyncio.run(main())


@pytest.fixture
def damaged(tmp_path: Path) -> Damaged:
    data_dir = tmp_path / "data"
    write_topic(data_dir)
    segment = data_dir / "t-0" / f"{0:020d}.log"
    original = segment.read_bytes()
    position, h = next((p, h) for p, h in iter_batches(original) if h.base_offset == VICTIM)
    assert h.next_offset == VICTIM + 1
    assert any(h.base_offset > VICTIM for _, h in iter_batches(original))  # more after it
    buf = bytearray(original)
    buf[position + h.size - 20] ^= 0x40  # inside the record value, under the CRC
    segment.write_bytes(bytes(buf))
    return Damaged(data_dir, segment, position, h.size, original)


def test_damage_through_the_binary_protocol(damaged: Damaged) -> None:
    with served(damaged.data_dir) as (running, _):
        addr = running.addr

        async def main() -> None:
            async with AsyncClient(addr) as client:
                # below the damage: served, ending before it
                got = await client.fetch("t", 0, 2, max_bytes=1 << 20)
                assert [r.offset for r in got.records] == [2, 3, 4]
                assert got.next_offset == VICTIM
                # at it: the specific error, with the range
                with pytest.raises(PartitionCorruptError) as info:
                    await client.fetch("t", 0, VICTIM)
                assert (info.value.damage_start, info.value.damage_end) == (VICTIM, VICTIM + 1)
                assert "damaged range 5..5" in info.value.message
                # after it, in the same segment and in later ones
                got = await client.fetch("t", 0, VICTIM + 1, max_bytes=1 << 20)
                assert got.records[0].offset == VICTIM + 1
                assert got.records[0].value == value(VICTIM + 1)
                got = await client.fetch("t", 0, N - 1)
                assert [r.value for r in got.records] == [value(N - 1)]
                # writes go on, and are read back
                assert await client.produce("t", 0, [Message(b"after")]) == N
                got = await client.fetch("t", 0, N)
                assert [r.value for r in got.records] == [b"after"]
                # a consumer that accepts the loss reads everything else, reporting the gap
                async with AsyncConsumer(addr, skip_damaged=True, max_wait_ms=0) as consumer:
                    await consumer.assign([("t", 0, "earliest")])
                    seen: list[int] = []
                    while len(seen) < N:
                        seen += [r.offset for r in await consumer.poll(TIMEOUT_S)]
                    assert seen == [o for o in range(N + 1) if o != VICTIM]
                    assert list(consumer.gaps) == [Gap("t", 0, VICTIM, VICTIM + 1)]
                    assert consumer.gaps_total == 1
                # without the option, the consumer raises with the range
                async with AsyncConsumer(addr, max_wait_ms=0) as consumer:
                    await consumer.assign([("t", 0, VICTIM)])
                    with pytest.raises(PartitionCorruptError) as info:
                        await consumer.poll(TIMEOUT_S)
                    assert info.value.damage_end == VICTIM + 1
                    assert consumer.position("t", 0) == VICTIM
                # describe and health show it
                desc = await client.describe_topic("t")
                (d,) = desc.partitions[0].damage
                assert (d.start, d.end, d.size_bytes) == (VICTIM, VICTIM + 1, damaged.size)
                assert (d.file, d.position) == (str(damaged.segment), damaged.position)
                assert d.quarantined == ""
                problems, total = await client.storage_problems()
                assert total == 1
                assert (problems[0].topic, problems[0].kind, problems[0].start) == (
                    "t",
                    "damaged",
                    VICTIM,
                )
                assert (await client.describe_topic("u")).partitions[0].damage == []

        asyncio.run(main())
        health = run_cli(["health", "--addr", addr])
        assert health.exit_code == 0
        first, line, *_ = health.stdout.splitlines()
        assert first.startswith("degraded: tidewire")
        assert f"t partition 0: offsets {VICTIM}..{VICTIM} ({damaged.size:,} bytes) damaged" in line
        described = run_cli(["topic", "describe", "t", "--addr", addr])
        assert described.exit_code == 0
        assert f"partition 0: offsets {VICTIM}..{VICTIM}" in described.stdout
        assert "DAMAGED" in described.stdout
        doc = json.loads(run_cli(["topic", "describe", "t", "--json", "--addr", addr]).stdout)
        assert doc["partitions"][0]["damage"][0]["start"] == VICTIM
        # consume --skip-damaged prints every other record and reports the gap
        out = run_cli(
            [
                "consume",
                "t",
                "--from-beginning",
                "--skip-damaged",
                "--count",
                str(N),
                "--addr",
                addr,
            ]
        )
        assert out.exit_code == 0, out.stderr
        assert out.stdout.splitlines() == [value(i).decode() for i in range(N) if i != VICTIM] + [
            "after"
        ]
        assert f"gap: t partition 0 offsets {VICTIM}..{VICTIM} lie in a damaged range" in out.stderr
        grouped = run_cli(
            [
                "consume",
                "t",
                "--group",
                "cli",
                "--from-beginning",
                "--skip-damaged",
                "--count",
                str(N),
                "--addr",
                addr,
            ]
        )
        assert grouped.exit_code == 0, grouped.stderr
        assert grouped.stdout.splitlines() == out.stdout.splitlines()
        assert f"gap: t partition 0 offsets {VICTIM}..{VICTIM} lie in a damaged range" in (
            grouped.stderr
        )
        refused = run_cli(["consume", "t", "--offset", str(VICTIM), "-p", "0", "--addr", addr])
        assert refused.exit_code != 0
        assert "damaged range" in refused.stderr


def test_damage_over_http(damaged: Damaged) -> None:
    with served(damaged.data_dir) as (_, http):
        url = "/v1/topics/t/partitions/0/messages"
        r = http.get(url, params={"offset": 2, "limit": 100})
        assert r.status_code == 200
        assert [m["offset"] for m in r.json()["messages"]] == [2, 3, 4]
        r = http.get(url, params={"offset": VICTIM})
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert (err["code"], err["name"]) == (32, "PartitionCorruptError")
        assert err["damaged_range"] == {"start": VICTIM, "end": VICTIM + 1}
        r = http.get(url, params={"offset": VICTIM, "limit": 3, "skip_damaged": "true"})
        assert r.status_code == 200
        page = r.json()
        assert [m["offset"] for m in page["messages"]] == [VICTIM + 1, VICTIM + 2, VICTIM + 3]
        assert page["gaps"] == [{"start": VICTIM, "end": VICTIM + 1}]
        assert "gaps" not in http.get(url, params={"offset": 0, "limit": 2}).json()
        # writes go on
        r = http.post("/v1/topics/t/messages", json={"value": "after", "partition": 0})
        assert r.status_code == 201, r.text
        assert r.json()["offset"] == N
        part = http.get("/v1/topics/t").json()["partitions"][0]
        assert part["damage"][0]["start"] == VICTIM
        assert part["damage"][0]["size_bytes"] == damaged.size
        storage = http.get("/healthz/storage").json()
        assert storage["status"] == "degraded"
        assert storage["problems"][0]["kind"] == "damaged"
        assert http.get("/healthz/ready").status_code == 200  # damage does not stop serving


def test_repair_quarantine(damaged: Damaged) -> None:
    with served(damaged.data_dir) as (running, http):
        addr = running.addr
        report = run_cli(["topic", "repair", "t", "--addr", addr])
        assert report.exit_code == 0, report.stderr
        assert f"partition 0: offsets {VICTIM}..{VICTIM}" in report.stdout
        assert "damaged in" in report.stdout
        both = run_cli(["topic", "repair", "t", "--quarantine", "--truncate", "--addr", addr])
        assert both.exit_code == 2
        done = run_cli(["topic", "repair", "t", "--quarantine", "--json", "--addr", addr])
        assert done.exit_code == 0, done.stderr
        (result,) = json.loads(done.stdout)
        assert result["action"] == "quarantined"
        quarantine = Path(result["file"])
        assert quarantine.parent == damaged.segment.parent
        # the file holds exactly the damaged bytes
        flipped = damaged.segment.read_bytes()
        assert (
            quarantine.read_bytes() == flipped[damaged.position : damaged.position + damaged.size]
        )
        # readers now pass the range as a gap: no error, the offset is missing
        r = http.get("/v1/topics/t/partitions/0/messages", params={"offset": 0, "limit": 100})
        offsets = [m["offset"] for m in r.json()["messages"]]
        assert offsets == [0, 1, 2, 3, 4]
        r = http.get("/v1/topics/t/partitions/0/messages", params={"offset": VICTIM})
        assert r.status_code == 200
        assert r.json()["messages"][0]["offset"] == VICTIM + 1
        damage = http.get("/v1/topics/t").json()["partitions"][0]["damage"]
        assert damage[0]["quarantined"] == str(quarantine)
        assert http.get("/healthz/storage").json()["problems"][0]["kind"] == "quarantined"
    # and after a restart
    with served(damaged.data_dir) as (_, http):
        r = http.get("/v1/topics/t/partitions/0/messages", params={"offset": VICTIM})
        assert r.json()["messages"][0]["offset"] == VICTIM + 1


def test_repair_truncate(damaged: Damaged) -> None:
    with served(damaged.data_dir) as (running, http):
        addr = running.addr
        unconfirmed = run_cli(["topic", "repair", "t", "--truncate", "--addr", addr])
        assert unconfirmed.exit_code == 2
        assert "--yes" in unconfirmed.stderr
        size_before = sum(p.stat().st_size for p in damaged.segment.parent.glob("*.log"))
        done = run_cli(["topic", "repair", "t", "--truncate", "--yes", "--addr", addr])
        assert done.exit_code == 0, done.stderr
        removed = N - VICTIM
        assert (
            f"partition 0: offsets {VICTIM}..{VICTIM} ({damaged.size:,} bytes): truncated; "
            f"{removed:,} offset(s)"
        ) in done.stdout
        assert f"the log now ends at {VICTIM}" in done.stdout
        size_after = sum(p.stat().st_size for p in damaged.segment.parent.glob("*.log"))
        assert size_after == damaged.position
        assert f"{size_before - size_after:,} bytes removed" in done.stdout
        part = http.get("/v1/topics/t").json()["partitions"][0]
        assert part["end_offset"] == VICTIM
        assert "damage" not in part
        assert http.get("/healthz/storage").json() == {
            "status": "ok",
            "problems": [],
            "problems_total": 0,
        }
        r = http.post("/v1/topics/t/messages", json={"value": "new", "partition": 0})
        assert r.json()["offset"] == VICTIM
        r = http.get("/v1/topics/t/partitions/0/messages", params={"offset": 0, "limit": 100})
        assert [m["value"] for m in r.json()["messages"]] == [
            value(i).decode() for i in range(VICTIM)
        ] + ["new"]


def test_an_unreadable_log_json_takes_only_its_partition_offline(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    write_topic(data_dir)
    (data_dir / "t-0" / "log.json").write_text("{not json")
    with served(data_dir) as (running, http):
        r = http.get("/v1/topics/u/partitions/0/messages", params={"offset": 0})
        assert [m["value"] for m in r.json()["messages"]] == ["healthy"]
        r = http.get("/v1/topics/t/partitions/0/messages", params={"offset": 0})
        assert r.status_code == 503
        assert r.json()["error"]["code"] == PartitionOfflineError.code
        assert "log.json" in r.json()["error"]["message"]
        part = http.get("/v1/topics/t").json()["partitions"][0]
        assert "log.json" in part["offline"]
        (problem,) = http.get("/healthz/storage").json()["problems"]
        assert (problem["topic"], problem["kind"]) == ("t", "offline")

        async def main() -> None:
            async with AsyncClient(running.addr) as client:
                with pytest.raises(PartitionOfflineError):
                    await client.fetch("t", 0, 0)
                with pytest.raises(PartitionOfflineError):
                    await client.produce("t", 0, [Message(b"x")])
                desc = await client.describe_topic("t")
                assert "log.json" in desc.partitions[0].offline
                assert await client.produce("u", 0, [Message(b"more")]) == 1

        asyncio.run(main())
        health = run_cli(["health", "--addr", running.addr])
        assert health.exit_code == 0
        assert "t partition 0: offline: log configuration" in health.stdout
        described = run_cli(["topic", "describe", "t", "--addr", running.addr])
        assert "partition 0 is OFFLINE" in described.stdout


def test_http_gap_reading_is_bounded(damaged: Damaged) -> None:
    """An ``httpx`` reader that follows ``next_offset`` with ``skip_damaged`` reads the whole
    partition and sees the gap once."""
    with served(damaged.data_dir) as (_, http):
        offset, seen, gaps = 0, [], []
        while offset < N:
            page = http.get(
                "/v1/topics/t/partitions/0/messages",
                params={"offset": offset, "limit": 7, "skip_damaged": "true"},
            ).json()
            seen += [m["offset"] for m in page["messages"]]
            gaps += page.get("gaps", [])
            offset = page["next_offset"]
        assert seen == [o for o in range(N) if o != VICTIM]
        assert gaps == [{"start": VICTIM, "end": VICTIM + 1}]
        assert isinstance(http, httpx.Client)


def test_a_group_member_skips_damage_when_asked(damaged: Damaged) -> None:
    with served(damaged.data_dir) as (running, _):

        async def main() -> None:
            async with AsyncGroupConsumer(
                running.addr,
                "g",
                topics=["t"],
                auto_offset_reset="earliest",
                skip_damaged=True,
                max_wait_ms=0,
            ) as member:
                seen: list[int] = []
                while len(seen) < N - 1:
                    seen += [r.offset for r in await member.poll(TIMEOUT_S)]
                assert seen == [o for o in range(N) if o != VICTIM]
                assert member.gaps == [Gap("t", 0, VICTIM, VICTIM + 1)]
                await member.commit()
            async with AsyncClient(running.addr) as client:
                committed = await client.committed_offsets("g")
                assert committed[("t", 0)] == N

        asyncio.run(main())
    with pytest.raises(ValueError, match="skip_damaged works with delivery='pull'"):
        AsyncGroupConsumer("127.0.0.1:1", "g", topics=["t"], skip_damaged=True, delivery="push")
