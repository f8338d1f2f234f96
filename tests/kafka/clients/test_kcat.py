"""kcat (librdkafka's command-line client, Debian's kcat package) against the Kafka listener:
metadata (-L), producing keyed messages with headers (-P) and consuming them back (-C) with
their offsets, keys, headers and timestamps, in each compression codec."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.kafka.clients.conftest import CODECS, Running

KCAT = shutil.which("kcat")
pytestmark = pytest.mark.skipif(
    KCAT is None, reason="kcat is not installed (apt-get install kcat; scripts/test does)"
)


def kcat(r: Running, *args: str, stdin: str | None = None) -> str:
    assert KCAT is not None
    done = subprocess.run(
        [KCAT, "-b", r.bootstrap, "-X", "topic.metadata.refresh.interval.ms=1000", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_metadata(running: Running) -> None:
    running.create_topic("listed", 3)
    md = json.loads(kcat(running, "-L", "-J"))
    (broker,) = md["brokers"]
    assert broker["name"] == running.bootstrap
    (topic,) = [t for t in md["topics"] if t["topic"] == "listed"]
    assert sorted(p["partition"] for p in topic["partitions"]) == [0, 1, 2]
    assert all(p["leader"] == broker["id"] for p in topic["partitions"])


@pytest.mark.parametrize("codec", CODECS)
def test_produce_and_consume(running: Running, codec: str) -> None:
    running.create_topic("lines", 1)
    lines = [f"key-{i % 3}\tvalue {i} {codec}" for i in range(20)]
    kcat(
        running,
        "-P",
        "-t",
        "lines",
        "-p",
        "0",
        "-K",
        "\t",
        "-H",
        "origin=kcat",
        "-z",
        codec,
        stdin="\n".join(lines) + "\n",
    )
    assert running.end_offsets("lines", 1) == [20]
    out = kcat(running, "-C", "-t", "lines", "-o", "beginning", "-e", "-J")
    got = [json.loads(line) for line in out.splitlines()]
    assert [g["offset"] for g in got] == list(range(20))
    assert [f"{g['key']}\t{g['payload']}" for g in got] == lines
    assert all(g["headers"] == ["origin", "kcat"] for g in got)
    assert all(g["tstype"] == "create" and g["ts"] > 0 for g in got)
    # a second read from offset 15 gives the same records from there
    tail = [
        json.loads(x)
        for x in kcat(running, "-C", "-t", "lines", "-o", "15", "-e", "-J").splitlines()
    ]
    assert tail == got[15:]
