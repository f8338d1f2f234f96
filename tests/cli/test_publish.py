"""``tidewire publish``: one message or stdin lines, routed by FNV-1a key hash or in turn,
grouped into batches; where they landed, in text and JSON."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
from collections import Counter
from pathlib import Path

from tests.cli._support import (
    STARTUP_S,
    Broker,
    closed_port,
    run_cli,
    serving,
    sigint_as_at_a_terminal,
    subprocess_env,
    tidewire_cmd,
)
from tidewire.client import Client
from tidewire.client.partitioner import fnv1a_32
from tidewire.records import Record

#: Bytes of a record batch's header: a message sent alone costs at least this much on disk.
BATCH_HEADER_BYTES = 61


def read_all(addr: str, topic: str) -> dict[int, list[Record]]:
    """Every record of every partition, by partition."""
    with Client(addr) as client:
        n = len(client.describe_topic(topic).partitions)
        out: dict[int, list[Record]] = {}
        for p in range(n):
            records: list[Record] = []
            offset = 0
            for _ in range(10_000):  # bound: more fetches than any test publishes
                got = client.fetch(topic, p, offset)
                records += got.records
                offset = got.next_offset
                if offset >= got.high_watermark:
                    break
            out[p] = records
        return out


def create(broker: Broker, topic: str, partitions: int) -> None:
    result = broker.cli("topic", "create", topic, "--partitions", str(partitions))
    assert result.exit_code == 0, result.stderr


def test_one_message_text_and_json(broker: Broker) -> None:
    create(broker, "t", 1)
    result = broker.cli("publish", "t", "hello")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "published to t partition 0 at offset 0\n"
    result = broker.cli("publish", "t", "again", "--json")
    assert json.loads(result.stdout) == {"topic": "t", "partition": 0, "offset": 1}
    records = read_all(broker.addr, "t")[0]
    assert [(r.key, r.value) for r in records] == [(None, b"hello"), (None, b"again")]


def test_key_headers_and_explicit_partition(broker: Broker) -> None:
    create(broker, "t", 4)
    result = broker.cli(
        "publish", "t", "v", "--key", "k", "-H", "a=1", "--header", "b=x=y", "-p", "2", "--json"
    )
    assert json.loads(result.stdout) == {"topic": "t", "partition": 2, "offset": 0}
    (rec,) = read_all(broker.addr, "t")[2]
    assert (rec.key, rec.value, rec.headers) == (b"k", b"v", (("a", b"1"), ("b", b"x=y")))


def test_keyed_messages_land_on_the_fnv1a_partition(broker: Broker) -> None:
    create(broker, "t", 5)
    keys = [f"user-{i}" for i in range(20)]
    for key in keys:
        doc = json.loads(broker.cli("publish", "t", f"of {key}", "-k", key, "--json").stdout)
        assert doc["partition"] == fnv1a_32(key.encode()) % 5
    by_partition = read_all(broker.addr, "t")
    for p, records in by_partition.items():
        for rec in records:
            assert rec.key is not None
            assert fnv1a_32(rec.key) % 5 == p
            assert rec.value == b"of " + rec.key
    assert sum(len(r) for r in by_partition.values()) == 20
    assert len({p for p, r in by_partition.items() if r}) > 1


def test_unkeyed_messages_go_round_robin(broker: Broker) -> None:
    create(broker, "t", 3)
    lines = "".join(f"m{i}\n" for i in range(30))
    result = broker.cli("publish", "t", "-", "--json", input=lines)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["topic"] == "t"
    assert doc["messages"] == 30
    assert [(p["partition"], p["messages"]) for p in doc["partitions"]] == [
        (0, 10),
        (1, 10),
        (2, 10),
    ]
    assert all((p["first_offset"], p["last_offset"]) == (0, 9) for p in doc["partitions"])
    got = read_all(broker.addr, "t")
    values = sorted(int(r.value[1:]) for rs in got.values() for r in rs if r.value)
    assert values == list(range(30))
    # In turn: consecutive lines on consecutive partitions.
    for records in got.values():
        nums = [int(r.value[1:]) for r in records if r.value]
        assert all(b - a == 3 for a, b in itertools.pairwise(nums))


def test_stdin_with_key_separator(broker: Broker) -> None:
    create(broker, "t", 4)
    lines = b"alice:1\r\nbob:2\ncarol:x:y\n:no key\nalice:3"
    result = broker.cli("publish", "t", "-", "--key-separator", ":", input=lines)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("published 5 message(s) to t\n")
    got = read_all(broker.addr, "t")
    pairs = {(r.key, r.value) for rs in got.values() for r in rs}
    assert pairs == {
        (b"alice", b"1"),
        (b"bob", b"2"),
        (b"carol", b"x:y"),
        (b"", b"no key"),
        (b"alice", b"3"),
    }
    for p, records in got.items():
        for rec in records:
            assert rec.key is not None
            assert fnv1a_32(rec.key) % 4 == p
    alice = [r.value for rs in got.values() for r in rs if r.key == b"alice"]
    assert alice == [b"1", b"3"]  # one partition, in order


def test_stdin_line_without_separator(broker: Broker) -> None:
    create(broker, "t", 1)
    result = broker.cli("publish", "t", "-", "--key-separator", "=", input="a=1\nb=2\noops\nc=3\n")
    assert result.exit_code == 1
    assert result.stderr == (
        "error: stdin line 3: no key separator '=' in it (2 message(s) were published before)\n"
    )
    assert [r.value for r in read_all(broker.addr, "t")[0]] == [b"1", b"2"]


def test_stdin_is_grouped_into_batches(broker: Broker) -> None:
    """Thousands of lines cost a few requests, not one each: each request is one batch, and
    a batch has a 61-byte header, so a log smaller than 61 bytes per message proves it."""
    create(broker, "t", 1)
    n = 12_000
    result = broker.cli("publish", "t", "-", input="".join(f"{i}\n" for i in range(n)))
    assert result.exit_code == 0, result.stderr
    desc = json.loads(broker.cli("topic", "describe", "t", "--json").stdout)
    part = desc["partitions"][0]
    assert part["log_end_offset"] == n
    assert part["size_bytes"] < n * BATCH_HEADER_BYTES // 4


def test_stdin_pipe_in_a_real_process(broker: Broker, tmp_path: Path) -> None:
    """The real stdin path (a pipe read by file descriptor), in a process of its own."""
    create(broker, "t", 2)
    data = "".join(f"k{i % 7}|v{i}\n" for i in range(5000)).encode()
    proc = subprocess.run(
        tidewire_cmd("publish", "t", "-", "--key-separator", "|", "--json", "--addr", broker.addr),
        input=data,
        capture_output=True,
        env=subprocess_env(),
        timeout=STARTUP_S,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["messages"] == 5000
    got = read_all(broker.addr, "t")
    counts = Counter(fnv1a_32(f"k{i % 7}".encode()) % 2 for i in range(5000))
    assert {p: len(rs) for p, rs in got.items()} == {0: counts[0], 1: counts[1]}


def test_first_publish_creates_the_topic(broker: Broker) -> None:
    result = broker.cli("publish", "fresh", "-", "--json", input="a\nb\nc\nd\n")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["messages"] == 4
    # Auto-created with the broker's 3 partitions before the first message was placed; the
    # messages went round the partitions from a random one.
    assert sorted(p["messages"] for p in doc["partitions"]) == [1, 1, 2]
    assert {p["partition"] for p in doc["partitions"]} == {0, 1, 2}
    # A keyed first message goes to its key's partition of the new topic.
    keyed = broker.cli("publish", "other", "v", "--key", "k", "--json")
    assert keyed.exit_code == 0, keyed.stderr
    assert json.loads(keyed.stdout) == {
        "topic": "other",
        "partition": fnv1a_32(b"k") % 3,
        "offset": 0,
    }


def test_no_auto_create(tmp_path: Path) -> None:
    with serving(tmp_path, "--no-auto-create") as (_, port):
        result = run_cli(["publish", "t", "v", "--addr", f"127.0.0.1:{port}"])
    assert result.exit_code == 1
    assert result.stderr == (
        "error: topic 't' does not exist and this broker does not create topics on first publish\n"
    )


def test_too_large_message(broker: Broker) -> None:
    assert broker.cli("topic", "create", "t", "--max-message-bytes", "100").exit_code == 0
    result = broker.cli("publish", "t", "x" * 200)
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ")
    assert "100" in result.stderr


def test_usage_errors(broker: Broker) -> None:
    for args, message in [
        (("publish", "t"), "error: give a MESSAGE, or '-' to read one message per line"),
        (("publish", "t", "v", "--header", "novalue"), "error: --header 'novalue' must be"),
        (("publish", "t", "v", "--key-separator", ":"), "error: --key-separator applies to"),
        (("publish", "t", "-", "-k", "a", "--key-separator", ":"), "error: give --key or"),
    ]:
        result = broker.cli(*args)
        assert result.exit_code == 2, args
        assert result.stderr.startswith(message), result.stderr


def test_unreachable_broker() -> None:
    port = closed_port()
    result = run_cli(["publish", "t", "v", "--addr", f"127.0.0.1:{port}"])
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: cannot connect to 127.0.0.1:{port}")


def test_slow_pipe_is_published_without_eof_and_ctrl_c_stops_it(broker: Broker) -> None:
    """Lines from a pipe that stays open are sent once they have waited LINGER_S, and Ctrl-C
    during the blocked read exits 130 at once, saying how many were published."""
    create(broker, "t", 1)
    proc = subprocess.Popen(
        tidewire_cmd("publish", "t", "-", "--addr", broker.addr),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=subprocess_env(),
        preexec_fn=sigint_as_at_a_terminal,  # noqa: PLW1509 - sets one signal, no locks
    )
    try:
        assert proc.stdin is not None
        proc.stdin.write(b"a\nb\n")
        proc.stdin.flush()
        with Client(broker.addr) as client:
            for _ in range(300):  # bound: 300 long-polls of up to 100 ms
                got = client.fetch("t", 0, 0, max_wait_ms=100)
                if len(got.records) == 2:
                    break
        assert [r.value for r in got.records] == [b"a", b"b"]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=STARTUP_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    # It counts what was acknowledged: the interrupt may come after the broker stored the two
    # lines but before the command read the answer (then they count as not published).
    assert err in (
        b"interrupted: 2 message(s) published\n",
        b"interrupted: 0 message(s) published\n",
    )
    assert out == b""
