"""The shipped examples, run small: the streaming pipeline (parse, windowed counts with a
watermark to a topic, the events archived to Parquet) and the batch backfill, run twice with
one name to show that a re-run stores nothing twice."""

from __future__ import annotations

import importlib.util
import json
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.spark._write_support import create_topic, read_topic, topic_name, values
from tidewire.client import Producer

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
T0_MS = 1_780_000_000_000 - 1_780_000_000_000 % 60_000  # a minute boundary


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_streaming_pipeline(spark: Any, broker: Any, tmp_path: Path) -> None:
    pipeline = load(EXAMPLES / "streaming_pipeline" / "pipeline.py")
    events, results = topic_name("ex-events"), topic_name("ex-counts")
    create_topic(broker.addr, events, 2)
    create_topic(broker.addr, results, 2)
    sent = []
    with Producer(broker.addr) as p:
        for i in range(300):  # three one-minute windows, two types
            e = {"user": f"u{i % 7}", "type": "ab"[i % 2], "amount": i}
            ts = T0_MS + (i // 100) * 60_000 + i % 100
            sent.append((ts, e))
            p.send(events, json.dumps(e).encode(), timestamp=ts)
        p.send(events, b"not json", timestamp=T0_MS)
        # far later: the watermark passes every window above, so append mode emits them
        p.send(events, json.dumps({"type": "tick"}).encode(), timestamp=T0_MS + 3_600_000)
    args = pipeline.parse_args(
        [
            "--servers", broker.addr, "--events", events, "--results", results,
            "--archive", str(tmp_path / "archive"), "--checkpoint", str(tmp_path / "ckpt"),
            "--once",
        ]
    )  # fmt: skip
    spark.conf.set(
        "spark.sql.streaming.stateStore.providerClass",
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    )
    try:
        for q in pipeline.run(spark, args):
            q.awaitTermination(300)
            assert q.exception() is None
    finally:
        spark.conf.unset("spark.sql.streaming.stateStore.providerClass")
    got = [json.loads(v) for v in values(broker.addr, results)]
    want: dict[tuple[int, str], list[int]] = {}
    for ts, e in sent:
        want.setdefault((ts // 60_000, e["type"]), []).append(e["amount"])
    counts = {(r["type"], r["events"], r["amount"]) for r in got if r["type"] in ("a", "b")}
    assert counts == {(t, len(a), sum(a)) for (_, t), a in want.items()}
    assert len(got) == len(counts)  # each window once
    for rs in read_topic(broker.addr, results).values():
        for r in rs:
            assert r.key == json.loads(r.value)["type"].encode()
    archived = spark.read.parquet(str(tmp_path / "archive")).collect()
    assert len(archived) == 301  # every event but the one that is not JSON
    stamps = [ts for ts, _ in sent] + [T0_MS + 3_600_000]
    assert {r.date for r in archived} == {
        datetime.fromtimestamp(ts / 1000, UTC).date() for ts in stamps
    }


def test_backfill_twice_stores_once(spark: Any, broker: Any, tmp_path: Path) -> None:
    backfill = load(EXAMPLES / "backfill" / "backfill.py")
    src = tmp_path / "rows"
    spark.createDataFrame(
        [(b"k%d" % (i % 5), b"row-%04d" % i, i % 3, i) for i in range(2_000)],
        "key binary, value binary, partition int, offset long",
    ).write.parquet(str(src))
    topic = topic_name("ex-backfill")
    create_topic(broker.addr, topic, 3)
    argv = ["--from", str(src), "--topic", topic, "--servers", broker.addr, "--name", "bf-1"]
    backfill.run(spark, backfill.parse_args(argv))
    backfill.run(spark, backfill.parse_args(argv))  # a re-run with the same name: nothing new
    got = values(broker.addr, topic)
    assert sorted(got) == sorted(b"row-%04d" % i for i in range(2_000))
    backfill.run(spark, backfill.parse_args([*argv[:-1], "bf-2"]))  # another name: again
    assert len(values(broker.addr, topic)) == 4_000
