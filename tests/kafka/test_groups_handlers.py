"""The Kafka group API handlers over a real broker, with request and response bodies passed
through the codec at the version a client would use (so every field the handlers fill must
fit that version): FindCoordinator, the join/sync/heartbeat/leave cycle, commits and fetches
with metadata, listings and descriptions (Kafka's and tidewire's views), deletion, the
boundary with tidewire's own groups, and authorization per resource."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tidewire.broker import Broker, BrokerConfig
from tidewire.broker.consumer_groups import ResetTo
from tidewire.broker.kafka_groups import KafkaGroupConfig
from tidewire.errors import GroupNotEmptyError, InconsistentGroupProtocolError
from tidewire.protocol.kafka import (
    ApiKey,
    ErrorCode,
    RequestHeader,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from tidewire.security.model import Operation, ResourceType
from tidewire.server.gate import Session, gate_for
from tidewire.server.kafka.context import KafkaContext
from tidewire.server.kafka.group_needs import GROUP_NEEDS
from tidewire.server.kafka.groups import GROUP_HANDLERS
from tidewire.server.needs import AUTHENTICATED, Need

T = TypeVar("T")
E = ErrorCode
Body = dict[str, Any]


def subscription(*topics: str) -> bytes:
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


def assignment(parts: dict[str, list[int]]) -> bytes:
    out = struct.pack(">hi", 0, len(parts))
    for t, ps in parts.items():
        out += struct.pack(">h", len(t)) + t.encode() + struct.pack(">i", len(ps))
        out += b"".join(struct.pack(">i", p) for p in ps)
    return out + struct.pack(">i", -1)


class Kafka:
    """Calls the group handlers of one broker as the listener would."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.denied: frozenset[Need] = frozenset()

    async def __call__(self, api: ApiKey, version: int, body: Body) -> Body:
        header = RequestHeader(int(api), version, 7, "client-1")
        _, decoded = decode_request(encode_request(header, body)[4:])
        ctx = KafkaContext(
            broker=self.broker,
            gate=gate_for(self.broker),
            session=Session("127.0.0.1:40000", "kafka"),
            header=header,
            node_id=0,
            host="broker.example",
            port=19092,
            cluster_id="c",
            denied=self.denied,
        )
        response = await GROUP_HANDLERS[api](ctx, version, decoded)
        assert response is not None
        cid, out = decode_response(int(api), version, encode_response(header, response)[4:])
        assert cid == 7
        return out


def run(tmp_path: Path, test: Callable[[Kafka], Awaitable[T]], delay_ms: int = 0) -> T:
    async def main() -> T:
        cfg = BrokerConfig(
            data_dir=str(tmp_path / "data"),
            kafka_groups=KafkaGroupConfig(initial_rebalance_delay_ms=delay_ms),
        )
        async with Broker(cfg) as b:
            b.create_topic("t", 3)
            b.create_topic("u", 1)
            return await test(Kafka(b))

    coro: Coroutine[Any, Any, T] = asyncio.wait_for(main(), 30)
    return asyncio.run(coro)


def join_body(member_id: str = "", topics: tuple[str, ...] = ("t",), **kw: Any) -> Body:
    body = {
        "group_id": "g",
        "session_timeout_ms": 10_000,
        "rebalance_timeout_ms": 10_000,
        "member_id": member_id,
        "group_instance_id": None,
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": subscription(*topics)}],
    }
    body.update(kw)
    return body


async def one_member_group(k: Kafka, version: int = 5) -> tuple[str, int]:
    """A group "g" of one member, synced, owning t/0-2: (member id, generation)."""
    first = await k(ApiKey.JOIN_GROUP, version, join_body())
    assert first["error_code"] == E.MEMBER_ID_REQUIRED
    member = first["member_id"]
    joined = await k(ApiKey.JOIN_GROUP, version, join_body(member))
    assert joined["error_code"] == 0
    assert joined["leader"] == member
    gen = joined["generation_id"]
    synced = await k(
        ApiKey.SYNC_GROUP,
        3,
        {
            "group_id": "g",
            "generation_id": gen,
            "member_id": member,
            "group_instance_id": None,
            "assignments": [{"member_id": member, "assignment": assignment({"t": [0, 1, 2]})}],
        },
    )
    assert synced["error_code"] == 0
    assert bytes(synced["assignment"]) == assignment({"t": [0, 1, 2]})
    return member, gen


def commit_body(member: str, gen: int, parts: list[tuple[str, int, int, str | None]]) -> Body:
    topics: dict[str, list[Body]] = {}
    for t, p, off, meta in parts:
        topics.setdefault(t, []).append(
            {"partition_index": p, "committed_offset": off, "committed_metadata": meta}
        )
    return {
        "group_id": "g",
        "generation_id_or_member_epoch": gen,
        "member_id": member,
        "group_instance_id": None,
        "retention_time_ms": -1,
        "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()],
    }


def errors_of(response: Body) -> dict[tuple[str, int], int]:
    return {
        (t["name"], p["partition_index"]): p["error_code"]
        for t in response["topics"]
        for p in t["partitions"]
    }


@pytest.mark.parametrize("version", [0, 1, 2, 4])
def test_find_coordinator_answers_this_broker(tmp_path: Path, version: int) -> None:
    async def test(k: Kafka) -> None:
        body = {"key": "g", "key_type": 0, "coordinator_keys": ["g", "h"]}
        r = await k(ApiKey.FIND_COORDINATOR, version, body)
        if version < 4:
            assert (r["error_code"], r["node_id"], r["host"], r["port"]) == (
                0,
                0,
                "broker.example",
                19092,
            )
        else:
            assert [
                (c["key"], c["host"], c["port"], c["error_code"]) for c in r["coordinators"]
            ] == [
                ("g", "broker.example", 19092, 0),
                ("h", "broker.example", 19092, 0),
            ]

    run(tmp_path, test)


def test_find_coordinator_refuses_transactions_and_denied_groups(tmp_path: Path) -> None:
    async def test(k: Kafka) -> None:
        r = await k(ApiKey.FIND_COORDINATOR, 2, {"key": "tx", "key_type": 1})
        assert r["error_code"] == E.INVALID_REQUEST
        assert "transactions" in r["error_message"]
        k.denied = frozenset({Need(ResourceType.GROUP, Operation.DESCRIBE, "secret")})
        r = await k(ApiKey.FIND_COORDINATOR, 2, {"key": "secret", "key_type": 0})
        assert r["error_code"] == E.GROUP_AUTHORIZATION_FAILED
        assert r["node_id"] == -1

    run(tmp_path, test)


def test_join_sync_heartbeat_leave_cycle(tmp_path: Path) -> None:
    async def test(k: Kafka) -> None:
        member, gen = await one_member_group(k)
        assert gen == 1
        hb = {"group_id": "g", "generation_id": gen, "member_id": member, "group_instance_id": None}
        assert (await k(ApiKey.HEARTBEAT, 3, hb))["error_code"] == 0
        assert (await k(ApiKey.HEARTBEAT, 3, {**hb, "generation_id": 0}))["error_code"] == (
            E.ILLEGAL_GENERATION
        )
        assert (await k(ApiKey.HEARTBEAT, 3, {**hb, "member_id": "x"}))["error_code"] == (
            E.UNKNOWN_MEMBER_ID
        )
        # tidewire's own view of the Kafka group: members, their topics and partitions
        d = k.broker.groups.describe("g")
        assert str(d.state) == "stable"
        assert d.strategy == "range"
        assert [(m.member_id, m.client_id, m.topics, m.assignment) for m in d.members] == [
            (member, "client-1", ("t",), [("t", 0), ("t", 1), ("t", 2)])
        ]
        listed = {g.group_id: g for g in k.broker.groups.list_groups()}
        assert listed["g"].members == 1
        left = await k(ApiKey.LEAVE_GROUP, 2, {"group_id": "g", "member_id": member})
        assert left["error_code"] == 0
        again = await k(ApiKey.LEAVE_GROUP, 2, {"group_id": "g", "member_id": member})
        assert again["error_code"] == E.UNKNOWN_MEMBER_ID
        assert (await k(ApiKey.HEARTBEAT, 3, hb))["error_code"] == E.UNKNOWN_MEMBER_ID

    run(tmp_path, test)


def test_join_v3_needs_no_member_id_round(tmp_path: Path) -> None:
    async def test(k: Kafka) -> None:
        r = await k(ApiKey.JOIN_GROUP, 3, join_body())
        assert r["error_code"] == 0
        assert r["member_id"].startswith("client-1-")
        assert r["generation_id"] == 1
        assert [bytes(m["metadata"]) for m in r["members"]] == [subscription("t")]

    run(tmp_path, test)


def test_three_members_join_and_one_leaving_rebalances_once(tmp_path: Path) -> None:
    async def test(k: Kafka) -> None:
        ids = [(await k(ApiKey.JOIN_GROUP, 5, join_body()))["member_id"] for _ in range(3)]
        joins = await asyncio.gather(*(k(ApiKey.JOIN_GROUP, 5, join_body(m)) for m in ids))
        assert {j["generation_id"] for j in joins} == {1}
        leader = joins[0]["leader"]
        assert [len(j["members"]) for j in joins] == [
            3 if j["member_id"] == leader else 0 for j in joins
        ]
        sync = {"group_id": "g", "generation_id": 1, "group_instance_id": None}
        plan = {m: assignment({"t": [i]}) for i, m in enumerate(ids)}
        followers = [
            asyncio.ensure_future(
                k(ApiKey.SYNC_GROUP, 3, {**sync, "member_id": m, "assignments": []})
            )
            for m in ids
            if m != leader
        ]
        lead = await k(
            ApiKey.SYNC_GROUP,
            3,
            {
                **sync,
                "member_id": leader,
                "assignments": [{"member_id": m, "assignment": a} for m, a in plan.items()],
            },
        )
        got = [lead, *[await f for f in followers]]
        order = [leader, *[m for m in ids if m != leader]]
        assert [bytes(s["assignment"]) for s in got] == [plan[m] for m in order]
        gone = order[2]
        left = await k(
            ApiKey.LEAVE_GROUP,
            3,
            {"group_id": "g", "members": [{"member_id": gone, "group_instance_id": None}]},
        )
        assert left["error_code"] == 0
        assert [m["error_code"] for m in left["members"]] == [0]
        rejoined = await asyncio.gather(*(k(ApiKey.JOIN_GROUP, 5, join_body(m)) for m in order[:2]))
        assert {j["generation_id"] for j in rejoined} == {2}
        assert k.broker.kafka_groups.rebalances == 2
        desc = await k(ApiKey.DESCRIBE_GROUPS, 3, {"groups": ["g"]})
        (g,) = desc["groups"]
        assert g["group_state"] == "CompletingRebalance"
        assert sorted(m["member_id"] for m in g["members"]) == sorted(order[:2])

    run(tmp_path, test, delay_ms=200)


def test_commit_and_fetch_keep_metadata(tmp_path: Path) -> None:
    async def test(k: Kafka) -> None:
        member, gen = await one_member_group(k)
        r = await k(
            ApiKey.OFFSET_COMMIT,
            7,
            commit_body(
                member, gen, [("t", 0, 5, "meta-0"), ("t", 1, 7, None), ("nope", 0, 1, "")]
            ),
        )
        assert errors_of(r) == {("t", 0): 0, ("t", 1): 0, ("nope", 0): E.UNKNOWN_TOPIC_OR_PARTITION}
        fetch = {"group_id": "g", "topics": [{"name": "t", "partition_indexes": [0, 1, 2]}]}
        f = await k(ApiKey.OFFSET_FETCH, 5, fetch)
        assert f["error_code"] == 0
        parts = {p["partition_index"]: p for p in f["topics"][0]["partitions"]}
        assert (parts[0]["committed_offset"], parts[0]["metadata"]) == (5, "meta-0")
        assert (parts[1]["committed_offset"], parts[1]["metadata"]) == (7, "")
        assert parts[2]["committed_offset"] == -1
        every = await k(ApiKey.OFFSET_FETCH, 5, {"group_id": "g", "topics": None})
        assert [
            (t["name"], [p["partition_index"] for p in t["partitions"]]) for t in every["topics"]
        ] == [("t", [0, 1])]
        batch = await k(
            ApiKey.OFFSET_FETCH,
            8,
            {
                "groups": [
                    {"group_id": "g", "topics": None},
                    {"group_id": "other", "topics": None},
                ],
                "require_stable": True,
            },
        )
        assert [(g["group_id"], g["error_code"], len(g["topics"])) for g in batch["groups"]] == [
            ("g", 0, 1),
            ("other", 0, 0),
        ]
        # the same offsets log as tidewire's own groups: its views show them, with lag
        lags = {(x.topic, x.partition): x for x in k.broker.groups.describe("g").offsets}
        assert (lags[("t", 0)].committed, lags[("t", 0)].metadata) == (5, "meta-0")
        assert lags[("t", 2)].committed == -1

    run(tmp_path, test)


def test_commit_fencing(tmp_path: Path) -> None:
    async def test(k: Kafka) -> None:
        # a simple commit (generation -1, no member) into a group nobody is in
        simple = await k(ApiKey.OFFSET_COMMIT, 2, commit_body("", -1, [("u", 0, 3, "x")]))
        assert errors_of(simple) == {("u", 0): 0}
        member, gen = await one_member_group(k)
        fenced = await k(ApiKey.OFFSET_COMMIT, 7, commit_body("", -1, [("u", 0, 4, "")]))
        assert errors_of(fenced) == {("u", 0): E.UNKNOWN_MEMBER_ID}
        stale = await k(ApiKey.OFFSET_COMMIT, 7, commit_body(member, gen + 1, [("u", 0, 4, "")]))
        assert errors_of(stale) == {("u", 0): E.ILLEGAL_GENERATION}
        big = await k(ApiKey.OFFSET_COMMIT, 7, commit_body(member, gen, [("u", 0, 4, "m" * 5000)]))
        assert errors_of(big) == {("u", 0): E.OFFSET_METADATA_TOO_LARGE}
        assert k.broker.groups.committed("g")[("u", 0)].offset == 3

    run(tmp_path, test)


def test_list_describe_and_delete(tmp_path: Path) -> None:
    async def test(k: Kafka) -> None:
        member, _ = await one_member_group(k)
        await k.broker.groups.commit("idle", {("t", 0): (1, "")})  # offsets only
        listed = await k(ApiKey.LIST_GROUPS, 4, {"states_filter": []})
        assert [
            (g["group_id"], g["protocol_type"], g["group_state"]) for g in listed["groups"]
        ] == [
            ("g", "consumer", "Stable"),
            ("idle", "", "Empty"),
        ]
        stable = await k(ApiKey.LIST_GROUPS, 4, {"states_filter": ["Stable"]})
        assert [g["group_id"] for g in stable["groups"]] == ["g"]
        old = await k(ApiKey.LIST_GROUPS, 2, {})
        assert [g["group_id"] for g in old["groups"]] == ["g", "idle"]
        d = await k(ApiKey.DESCRIBE_GROUPS, 3, {"groups": ["g", "idle", "missing"]})
        g, idle, missing = d["groups"]
        assert (g["group_state"], g["protocol_type"], g["protocol_data"]) == (
            "Stable",
            "consumer",
            "range",
        )
        (m,) = g["members"]
        assert (m["member_id"], m["client_id"], m["client_host"]) == (
            member,
            "client-1",
            "/127.0.0.1",
        )
        assert bytes(m["member_metadata"]) == subscription("t")
        assert bytes(m["member_assignment"]) == assignment({"t": [0, 1, 2]})
        assert (idle["group_state"], idle["members"]) == ("Empty", [])
        assert missing["group_state"] == "Dead"
        deleted = await k(ApiKey.DELETE_GROUPS, 1, {"groups_names": ["g", "idle", "missing"]})
        assert [(r["group_id"], r["error_code"]) for r in deleted["results"]] == [
            ("g", E.NON_EMPTY_GROUP),
            ("idle", 0),
            ("missing", E.GROUP_ID_NOT_FOUND),
        ]
        assert "idle" not in k.broker.groups.offsets.groups()
        await k(ApiKey.LEAVE_GROUP, 1, {"group_id": "g", "member_id": member})
        again = await k(ApiKey.DELETE_GROUPS, 1, {"groups_names": ["g"]})
        assert again["results"][0]["error_code"] == 0

    run(tmp_path, test)


def test_a_group_id_belongs_to_one_protocol(tmp_path: Path) -> None:
    async def test(k: Kafka) -> None:
        b = k.broker
        await b.groups.coordinator.join("tw", topics=["t"])
        r = await k(ApiKey.JOIN_GROUP, 5, join_body(group_id="tw"))
        assert r["error_code"] == E.INCONSISTENT_GROUP_PROTOCOL
        listed = await k(ApiKey.LIST_GROUPS, 4, {"states_filter": []})
        assert ("tw", "tidewire") in [(g["group_id"], g["protocol_type"]) for g in listed["groups"]]
        await one_member_group(k)
        with pytest.raises(InconsistentGroupProtocolError, match="Kafka"):
            await b.groups.coordinator.join("g", topics=["t"])
        # tidewire's administration treats the Kafka members as members
        with pytest.raises(GroupNotEmptyError):
            await b.groups.commit("g", {("t", 0): (1, "")})
        with pytest.raises(GroupNotEmptyError):
            await b.groups.delete("g")
        with pytest.raises(GroupNotEmptyError):
            await b.groups.reset("g", "t", ResetTo.EARLIEST)

    run(tmp_path, test)


def test_authorization_per_resource(tmp_path: Path) -> None:
    async def test(k: Kafka) -> None:
        member, gen = await one_member_group(k)
        k.denied = frozenset({Need(ResourceType.TOPIC, Operation.READ, "u")})
        r = await k(
            ApiKey.OFFSET_COMMIT, 7, commit_body(member, gen, [("t", 0, 1, ""), ("u", 0, 1, "")])
        )
        assert errors_of(r) == {("t", 0): 0, ("u", 0): E.TOPIC_AUTHORIZATION_FAILED}
        f = await k(
            ApiKey.OFFSET_FETCH,
            5,
            {
                "group_id": "g",
                "topics": [
                    {"name": "t", "partition_indexes": [0]},
                    {"name": "u", "partition_indexes": [0]},
                ],
            },
        )
        assert errors_of(f) == {("t", 0): 0, ("u", 0): E.TOPIC_AUTHORIZATION_FAILED}
        k.denied = frozenset({Need(ResourceType.GROUP, Operation.READ, "g")})
        for api, version, body in [
            (ApiKey.JOIN_GROUP, 5, join_body(member)),
            (ApiKey.HEARTBEAT, 3, {"group_id": "g", "generation_id": gen, "member_id": member}),
            (
                ApiKey.SYNC_GROUP,
                3,
                {"group_id": "g", "generation_id": gen, "member_id": member, "assignments": []},
            ),
            (ApiKey.LEAVE_GROUP, 2, {"group_id": "g", "member_id": member}),
            (ApiKey.OFFSET_FETCH, 5, {"group_id": "g", "topics": None}),
        ]:
            assert (await k(api, version, body))["error_code"] == E.GROUP_AUTHORIZATION_FAILED, api
        r = await k(ApiKey.OFFSET_COMMIT, 7, commit_body(member, gen, [("t", 0, 2, "")]))
        assert errors_of(r) == {("t", 0): E.GROUP_AUTHORIZATION_FAILED}
        k.denied = frozenset({Need(ResourceType.GROUP, Operation.DELETE, "g")})
        d = await k(ApiKey.DELETE_GROUPS, 1, {"groups_names": ["g"]})
        assert d["results"][0]["error_code"] == E.GROUP_AUTHORIZATION_FAILED

    run(tmp_path, test)


def decoded(api: ApiKey, version: int, body: Body) -> Body:
    """The body as the listener hands it over: every field of the schema filled."""
    return decode_request(encode_request(RequestHeader(int(api), version, 1, "c"), body)[4:])[1]


def test_group_needs_declare_every_group_api() -> None:
    G, T = ResourceType.GROUP, ResourceType.TOPIC
    Op = Operation
    assert set(GROUP_NEEDS) == set(GROUP_HANDLERS)
    assert GROUP_NEEDS[ApiKey.LIST_GROUPS] is AUTHENTICATED

    def needs(api: ApiKey, version: int, body: Body) -> list[Need]:
        req = GROUP_NEEDS[api]
        assert callable(req)
        return list(req(decoded(api, version, body)))

    assert needs(ApiKey.JOIN_GROUP, 5, join_body()) == [Need(G, Op.READ, "g")]
    assert needs(
        ApiKey.OFFSET_COMMIT, 7, commit_body("m", 1, [("t", 0, 1, ""), ("u", 0, 1, "")])
    ) == [
        Need(G, Op.READ, "g"),
        Need(T, Op.READ, "t"),
        Need(T, Op.READ, "u"),
    ]
    assert needs(ApiKey.OFFSET_FETCH, 5, {"group_id": "g", "topics": None}) == [
        Need(G, Op.READ, "g")
    ]
    assert needs(
        ApiKey.OFFSET_FETCH,
        8,
        {
            "groups": [
                {"group_id": "a", "topics": [{"name": "t", "partition_indexes": [0]}]},
                {"group_id": "b", "topics": None},
            ]
        },
    ) == [Need(G, Op.READ, "a"), Need(G, Op.READ, "b"), Need(T, Op.READ, "t")]
    assert needs(ApiKey.FIND_COORDINATOR, 2, {"key": "g", "key_type": 0}) == [
        Need(G, Op.DESCRIBE, "g")
    ]
    assert needs(ApiKey.FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": ["a", "b"]}) == [
        Need(G, Op.DESCRIBE, "a"),
        Need(G, Op.DESCRIBE, "b"),
    ]
    assert needs(ApiKey.FIND_COORDINATOR, 2, {"key": "tx", "key_type": 1}) == []
    assert needs(ApiKey.DESCRIBE_GROUPS, 3, {"groups": ["a", "b"]}) == [
        Need(G, Op.DESCRIBE, "a"),
        Need(G, Op.DESCRIBE, "b"),
    ]
    assert needs(ApiKey.DELETE_GROUPS, 1, {"groups_names": ["a"]}) == [Need(G, Op.DELETE, "a")]
