"""The admin APIs over the Kafka listener: Metadata (every topic, auto-creation honoured
only when asked and allowed), CreateTopics (defaults, replication factors, configs mapped
onto tidewire's, validate_only), CreatePartitions (a result for every topic, never fewer
partitions), DeleteTopics (by name and by id), DescribeConfigs and DescribeCluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.kafka._support import aio, kafka_broker, wire
from tidewire.protocol.kafka import ApiKey, ErrorCode
from tidewire.storage import FsyncPolicy


def _topic(name: str, n: int = -1, rf: int = -1, **configs: str) -> dict[str, Any]:
    return {
        "name": name,
        "num_partitions": n,
        "replication_factor": rf,
        "assignments": [],
        "configs": [{"name": k.replace("_", "."), "value": v} for k, v in configs.items()],
    }


@aio
async def test_metadata_lists_topics_and_creates_only_when_allowed(tmp_path: Path) -> None:
    async with kafka_broker(tmp_path, default_partitions=3) as (b, k), wire(k.port) as w:
        b.create_topic("a", 2)
        got = await w.call(ApiKey.METADATA, 8, {"topics": None})
        assert [t["name"] for t in got["topics"]] == ["a"]  # no internal topic shows
        (a,) = got["topics"]
        assert [(p["partition_index"], p["leader_id"], p["replica_nodes"], p["isr_nodes"])
                for p in a["partitions"]] == [(0, 0, [0], [0]), (1, 0, [0], [0])]  # fmt: skip
        v0 = await w.call(ApiKey.METADATA, 0, {"topics": []})  # v0: empty means every topic
        assert [t["name"] for t in v0["topics"]] == ["a"]
        asked = {"topics": [{"name": "new"}], "allow_auto_topic_creation": False}
        got = await w.call(ApiKey.METADATA, 8, asked)
        assert got["topics"][0]["error_code"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert "new" not in b.topics()
        got = await w.call(ApiKey.METADATA, 8, asked | {"allow_auto_topic_creation": True})
        assert got["topics"][0]["error_code"] == 0
        assert len(got["topics"][0]["partitions"]) == 3 == b.topics()["new"]
        got = await w.call(ApiKey.METADATA, 8, {"topics": [{"name": "__security"}]})
        assert got["topics"][0]["error_code"] == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    async with kafka_broker(tmp_path, auto_create_topics=False) as (b, k), wire(k.port) as w:
        asked = {"topics": [{"name": "other"}], "allow_auto_topic_creation": True}
        got = await w.call(ApiKey.METADATA, 8, asked)
        assert got["topics"][0]["error_code"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert "other" not in b.topics()


@aio
async def test_create_topics(tmp_path: Path) -> None:
    async with kafka_broker(tmp_path, default_partitions=2) as (b, k), wire(k.port) as w:
        body = {
            "topics": [
                _topic("d"),
                _topic("three", 3, 1, retention_ms="60000", cleanup_policy="delete"),
                _topic("rf3", 1, 3),
                _topic("cfg", 1, 1, unknown_thing="1"),
                _topic("compact", 1, 1, cleanup_policy="compact"),
                _topic("zero", 0, 1),
                _topic("flush", 1, 1, flush_ms="0"),
            ],
            "timeout_ms": 5000,
        }
        got = await w.call(ApiKey.CREATE_TOPICS, 3, body)
        codes = {t["name"]: t["error_code"] for t in got["topics"]}
        assert codes == {
            "d": 0,
            "three": 0,
            "rf3": ErrorCode.INVALID_REPLICATION_FACTOR,
            "cfg": ErrorCode.INVALID_CONFIG,
            "compact": ErrorCode.INVALID_CONFIG,
            "zero": ErrorCode.INVALID_PARTITIONS,
            "flush": 0,
        }
        messages = {t["name"]: t["error_message"] for t in got["topics"]}
        assert "unknown.thing" in messages["cfg"]
        assert "3" in messages["rf3"]
        assert b.topics() == {"d": 2, "three": 3, "flush": 1}
        assert b.topic_config("three").retention_ms == 60_000
        assert b.topic_config("flush").fsync is FsyncPolicy.ALWAYS
        again = await w.call(ApiKey.CREATE_TOPICS, 3, {"topics": [_topic("d")]})
        assert again["topics"][0]["error_code"] == ErrorCode.TOPIC_ALREADY_EXISTS
        dry = {"topics": [_topic("dry", 4, 1)], "validate_only": True}
        got = await w.call(ApiKey.CREATE_TOPICS, 3, dry)
        assert got["topics"][0]["error_code"] == 0
        assert "dry" not in b.topics()


@aio
async def test_create_partitions_answers_every_topic(tmp_path: Path) -> None:
    async with kafka_broker(tmp_path) as (b, k), wire(k.port) as w:
        b.create_topic("a", 2)
        b.create_topic("b", 3)
        body = {
            "topics": [
                {"name": "a", "count": 4, "assignments": None},
                {"name": "b", "count": 2, "assignments": None},
                {"name": "b2", "count": 2, "assignments": None},
            ],
            "timeout_ms": 5000,
            "validate_only": False,
        }
        got = await w.call(ApiKey.CREATE_PARTITIONS, 1, body)
        assert [(r["name"], r["error_code"]) for r in got["results"]] == [
            ("a", 0),
            ("b", ErrorCode.INVALID_PARTITIONS),
            ("b2", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        ]
        assert "3 partition(s)" in got["results"][1]["error_message"]
        assert b.topics()["a"] == 4
        assert b.topics()["b"] == 3


@aio
async def test_delete_topics_and_describe(tmp_path: Path) -> None:
    async with kafka_broker(tmp_path) as (b, k), wire(k.port) as w:
        b.create_topic("a", 1)
        b.create_topic("b", 1)
        got = await w.call(ApiKey.DELETE_TOPICS, 3, {"topic_names": ["a", "nope"]})
        assert [(r["name"], r["error_code"]) for r in got["responses"]] == [
            ("a", 0),
            ("nope", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        ]
        assert set(b.topics()) == {"b"}
        configs = await w.call(
            ApiKey.DESCRIBE_CONFIGS,
            2,
            {
                "resources": [
                    {"resource_type": 2, "resource_name": "b", "configuration_keys": None},
                    {"resource_type": 4, "resource_name": "0", "configuration_keys": None},
                    {"resource_type": 2, "resource_name": "a", "configuration_keys": None},
                ]
            },
        )
        topic, broker, gone = configs["results"]
        values = {c["name"]: c["value"] for c in topic["configs"]}
        assert values["retention.ms"] == str(b.config.log.retention_ms)
        assert values["min.insync.replicas"] == "1"
        assert values["cleanup.policy"] == "delete"
        assert values["max.message.bytes"] == str(b.config.log.max_batch_bytes)
        assert {c["name"] for c in broker["configs"]} >= {"num.partitions", "message.max.bytes"}
        assert gone["error_code"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        cluster = await w.call(ApiKey.DESCRIBE_CLUSTER, 0, {})
        assert cluster["error_code"] == 0
        assert cluster["brokers"][0]["port"] == k.port
        assert cluster["controller_id"] == 0
