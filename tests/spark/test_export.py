"""``tidewire export``: a topic copied into Parquet partitioned by topic partition, once per
record across runs that resume from the checkpoint, with a progress report per micro-batch;
the command's usage errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli._support import run_cli
from tests.spark._write_support import create_topic, topic_name
from tidewire.client import Producer
from tidewire.spark._export import BatchProgress, ExportSpec, run_export


def publish(addr: str, topic: str, ids: range) -> None:
    with Producer(addr) as p:
        for i in ids:
            p.send(topic, b"v%06d" % i, key=b"k%d" % (i % 11), headers=[("i", b"%d" % i)])


def test_export_once_twice_copies_each_record_once(spark: Any, broker: Any, tmp_path: Path) -> None:
    topic = topic_name("export")
    create_topic(broker.addr, topic, 3)
    publish(broker.addr, topic, range(3_000))
    out = tmp_path / "out"
    spec = ExportSpec(
        servers=broker.addr,
        topic=topic,
        to=str(out),
        checkpoint=str(tmp_path / "ckpt"),
        once=True,
        max_offsets_per_trigger=1_000,
    )
    batches: list[BatchProgress] = []
    run_export(spark, spec, batches.append)
    assert sum(b.rows for b in batches) == 3_000
    assert len(batches) >= 3  # maxOffsetsPerTrigger bounds each batch
    assert all(b.rows <= 1_000 for b in batches)
    assert "rows/s" in batches[0].line()
    assert batches[0].to_json()["rows"] == batches[0].rows
    ends = {tp: end for b in batches for tp, (_, end) in b.offsets.items()}
    assert sum(ends.values()) == 3_000

    publish(broker.addr, topic, range(3_000, 4_000))
    more: list[BatchProgress] = []
    run_export(spark, spec, more.append)  # resumes from the checkpoint
    assert sum(b.rows for b in more) == 1_000

    assert sorted(p.name for p in out.iterdir() if p.name.startswith("partition=")) == [
        "partition=0",
        "partition=1",
        "partition=2",
    ]
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(r.value for r in rows) == [b"v%06d" % i for i in range(4_000)]
    for r in rows:
        i = int(r.value[1:])
        assert r.key == b"k%d" % (i % 11)
        assert [(h.key, h.value) for h in r.headers] == [("i", b"%d" % i)]
        assert r.topic == topic
        assert r.date is not None
    per_partition = {(r.partition, r.offset) for r in rows}
    assert len(per_partition) == 4_000


def test_the_command_with_json_progress(spark: Any, broker: Any, tmp_path: Path) -> None:
    topic = topic_name("export-cli")
    create_topic(broker.addr, topic, 2)
    publish(broker.addr, topic, range(500))
    out = tmp_path / "out"
    args = ["export", topic, "--to", str(out), "--once", "--addr", broker.addr]
    result = run_cli([*args, "--json", "--partition-by", "date,partition"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines()]
    assert lines[-1] == {"done": True, "batches": len(lines) - 1, "rows": 500, "to": str(out)}
    assert sum(b["rows"] for b in lines[:-1]) == 500
    assert {tp for b in lines[:-1] for tp in b["offsets"]} == {f"{topic}-0", f"{topic}-1"}
    assert (out / "_checkpoint").is_dir()
    assert next(out.iterdir()).name.startswith(("date=", "_"))
    again = run_cli(args)  # nothing new: resumes from the checkpoint and copies nothing
    assert again.exit_code == 0, again.output
    assert again.output.strip().endswith(f"exported 0 rows in 0 batches to {out}")
    assert spark.read.parquet(str(out)).count() == 500


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "avro"], "--format 'avro'"),
        (["--partition-by", "hour"], "--partition-by 'hour'"),
        (["--starting-offsets", "middle"], "--starting-offsets"),
        (["--addr", "nowhere"], "--addr"),
    ],
)
def test_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    result = run_cli(["export", "t", "--to", str(tmp_path / "out"), *args])
    assert result.exit_code == 2
    assert message in result.output
