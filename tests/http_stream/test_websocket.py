"""The WebSocket stream against a real gateway: the message shape and encodings, every ``from``,
credit in messages and bytes never exceeded, consumer groups (delivery from the committed
offsets, commit moving the group's offset as the binary protocol sees it, a rebalance between
two sockets), and a specific close code and error for each bad command or parameter."""

from __future__ import annotations

import base64
import contextlib
import json
import time
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed

from tests.http_stream._support import (
    PROMPT_S,
    QUIET_S,
    create,
    gateway,
    open_ws,
    produce,
    recv_json,
    recv_messages,
)
from tidewire.client import Client, GroupConsumer, Message


def test_from_earliest_in_order_with_the_documented_shape(tmp_path: Path) -> None:
    with gateway(tmp_path) as eb:
        create(eb, "orders")
        with Client(eb.addr) as c:
            c.produce(
                "orders",
                0,
                [
                    Message(
                        f"v{i}".encode(), key=b"k", headers=[("h", b"x")], timestamp_ms=1000 + i
                    )
                    for i in range(20)
                ],
            )
        with open_ws(eb, "orders", "from=earliest") as ws:
            hello = recv_json(ws)
            assert hello["type"] == "subscribed"
            assert hello["partitions"] == [{"partition": 0, "offset": 0}]
            got = recv_messages(ws, 20)
    assert [m["offset"] for m in got] == list(range(20))
    assert got[3] == {
        "type": "message",
        "topic": "orders",
        "partition": 0,
        "offset": 3,
        "timestamp": 1003,
        "key": "k",
        "value": "v3",
        "headers": {"h": "x"},
        "encoding": "utf-8",
    }


def test_binary_values_come_as_base64_and_base64_on_request(tmp_path: Path) -> None:
    with gateway(tmp_path) as eb:
        create(eb, "bin")
        produce(eb, "bin", [b"\xff\xfe", b"text"])
        with open_ws(eb, "bin", "from=earliest") as ws:
            recv_json(ws)
            raw, text = recv_messages(ws, 2)
        with open_ws(eb, "bin", "from=earliest&encoding=base64") as ws:
            recv_json(ws)
            _, forced = recv_messages(ws, 2)
    assert raw["encoding"] == "base64"
    assert base64.b64decode(raw["value"]) == b"\xff\xfe"
    assert (text["encoding"], text["value"]) == ("utf-8", "text")
    assert (forced["encoding"], base64.b64decode(forced["value"])) == ("base64", b"text")


def test_from_latest_offset_and_timestamp(tmp_path: Path) -> None:
    with gateway(tmp_path) as eb:
        create(eb, "t")
        with Client(eb.addr) as c:
            c.produce("t", 0, [Message(b"old%d" % i, timestamp_ms=5000 + i) for i in range(10)])
        with (
            open_ws(eb, "t") as latest,
            open_ws(eb, "t", "from=offset:7") as at_offset,
            open_ws(eb, "t", "from=timestamp:5004") as at_time,
            open_ws(eb, "t", "from=3") as bare,
        ):
            assert recv_json(latest)["partitions"] == [{"partition": 0, "offset": 10}]
            for ws in (at_offset, at_time, bare):
                recv_json(ws)
            produce(eb, "t", [b"new"])
            assert [m["value"] for m in recv_messages(latest, 1)] == ["new"]
            assert [m["offset"] for m in recv_messages(at_offset, 4)] == [7, 8, 9, 10]
            assert [m["offset"] for m in recv_messages(at_time, 7)] == list(range(4, 11))
            assert recv_messages(bare, 1)[0]["offset"] == 3


def test_message_credit_is_never_exceeded(tmp_path: Path) -> None:
    with gateway(tmp_path) as eb:
        create(eb, "c")
        produce(eb, "c", [b"m%d" % i for i in range(50)])
        with open_ws(eb, "c", "from=earliest&credit=5&batch=3") as ws:
            assert recv_json(ws)["credit"]["messages"] == 5
            assert len(recv_messages(ws, 5)) == 5
            with pytest.raises(TimeoutError):
                ws.recv(timeout=QUIET_S)
            ws.send(json.dumps({"type": "credit", "messages": 12}))
            got = recv_messages(ws, 12)
            assert got[-1]["offset"] == 16
            with pytest.raises(TimeoutError):
                ws.recv(timeout=QUIET_S)


def test_byte_credit_is_never_exceeded(tmp_path: Path) -> None:
    with gateway(tmp_path) as eb:
        create(eb, "b")
        produce(eb, "b", [b"x" * 100 for _ in range(30)])
        with open_ws(eb, "b", "from=earliest") as probe:
            recv_json(probe)
            size = len(probe.recv(timeout=5))  # one message's JSON, as the credit counts it
        window = size * 4 + size // 2
        received = 0
        with open_ws(eb, "b", f"from=earliest&credit=1000&credit_bytes={window}") as ws:
            recv_json(ws)
            for _ in range(4):
                received += len(ws.recv(timeout=5))
            with pytest.raises(TimeoutError):  # a fifth would pass the window
                ws.recv(timeout=QUIET_S)
            assert received <= window
            given_back = received
            ws.send(json.dumps({"type": "credit", "bytes": given_back}))
            for _ in range(4):
                received += len(ws.recv(timeout=5))
            with pytest.raises(TimeoutError):
                ws.recv(timeout=QUIET_S)
        assert received <= window + given_back


def test_a_message_larger_than_the_byte_window_goes_alone(tmp_path: Path) -> None:
    with gateway(tmp_path) as eb:
        create(eb, "big")
        produce(eb, "big", [b"y" * 5000, b"small"])
        with open_ws(eb, "big", "from=earliest&credit_bytes=1000") as ws:
            recv_json(ws)
            (big,) = recv_messages(ws, 1)
            assert len(big["value"]) == 5000
            with pytest.raises(TimeoutError):  # credit below zero: nothing until given back
                ws.recv(timeout=QUIET_S)
            ws.send(json.dumps({"type": "credit", "bytes": 5200}))
            assert recv_messages(ws, 1)[0]["value"] == "small"


def test_group_delivery_commit_and_resume(tmp_path: Path) -> None:
    with gateway(tmp_path) as eb:
        create(eb, "g", partitions=2)
        produce(eb, "g", [b"a%d" % i for i in range(5)], partition=0)
        produce(eb, "g", [b"b%d" % i for i in range(3)], partition=1)
        with open_ws(eb, "g", "group=billing&from=earliest") as ws:
            hello = recv_json(ws)
            assert hello["group"] == "billing"
            assert hello["member_id"]
            assert sorted(p["partition"] for p in hello["partitions"]) == [0, 1]
            got = recv_messages(ws, 8)
            assert sorted((m["partition"], m["offset"]) for m in got) == [
                (0, i) for i in range(5)
            ] + [(1, i) for i in range(3)]
            ws.send(json.dumps({"type": "commit"}))
            assert recv_json(ws) == {
                "type": "committed",
                "offsets": [{"partition": 0, "offset": 5}, {"partition": 1, "offset": 3}],
            }
            with Client(eb.addr) as c:
                assert c.committed_offsets("billing") == {("g", 0): 5, ("g", 1): 3}
            ws.send(json.dumps({"type": "commit", "offsets": [{"partition": 0, "offset": 2}]}))
            assert recv_json(ws)["offsets"] == [{"partition": 0, "offset": 2}]
            with Client(eb.addr) as c:
                assert c.committed_offsets("billing")[("g", 0)] == 2
        with Client(eb.addr) as c:  # the socket closed: the member left, the group is empty
            assert c.describe_group("billing").members == []
        produce(eb, "g", [b"a5"], partition=0)
        with open_ws(eb, "g", "group=billing&from=latest") as ws:  # from the committed offsets
            hello = recv_json(ws)
            assert sorted((p["partition"], p["offset"]) for p in hello["partitions"]) == [
                (0, 2),
                (1, 3),
            ]
            assert [m["value"] for m in recv_messages(ws, 4)] == ["a2", "a3", "a4", "a5"]


def test_two_sockets_in_a_group_share_the_partitions(tmp_path: Path) -> None:
    with gateway(tmp_path) as eb:
        create(eb, "shared", partitions=2)
        with open_ws(eb, "shared", "group=pair&from=earliest") as first:
            assert len(recv_json(first)["partitions"]) == 2
            with open_ws(eb, "shared", "group=pair&from=earliest") as second:
                mine = {p["partition"] for p in recv_json(second)["partitions"]}
                assigned = recv_json(first)
                assert assigned["type"] == "assigned"
                theirs = {p["partition"] for p in assigned["partitions"]}
                assert mine | theirs == {0, 1}
                assert not mine & theirs
                produce(eb, "shared", [b"to-%d" % p for p in sorted(mine)], partition=min(mine))
                got = recv_messages(second, 1)[0]
                assert got["partition"] == min(mine)
                with pytest.raises(TimeoutError):
                    first.recv(timeout=QUIET_S)


@pytest.mark.parametrize(
    ("send", "code", "words"),
    [
        ("not json", 1007, "not JSON"),
        (b"\x00binary", 1003, "JSON text frames"),
        (json.dumps({"type": "dance"}), 1008, "unknown command 'dance'"),
        (json.dumps([1, 2]), 1008, "unknown command None"),
        (json.dumps({"type": "credit", "messages": -1}), 1008, "messages=-1"),
        (json.dumps({"type": "credit", "messages": True}), 1008, "messages=True"),
        (json.dumps({"type": "credit"}), 1008, "grants messages or bytes"),
        (json.dumps({"type": "credit", "messages": 1, "x": 1}), 1008, "unknown field"),
        (json.dumps({"type": "commit"}), 1008, "needs a stream opened with ?group="),
        ("x" * 70_000, 1009, "exceeds 65,536"),
    ],
)
def test_bad_commands_close_with_a_specific_code(
    tmp_path: Path, send: str | bytes, code: int, words: str
) -> None:
    with gateway(tmp_path) as eb:
        create(eb, "cmd")
        with open_ws(eb, "cmd") as ws:
            recv_json(ws)
            ws.send(send)
            err = recv_json(ws)
            assert err["type"] == "error", err
            assert words in err["error"]["message"], err
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=5)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == code


def test_bad_group_commit_offsets_close_and_a_fenced_commit_does_not(tmp_path: Path) -> None:
    with gateway(tmp_path) as eb:
        create(eb, "gc", partitions=2)
        with open_ws(eb, "gc", "group=gg") as ws:
            recv_json(ws)
            ws.send(json.dumps({"type": "commit", "offsets": [{"partition": 7, "offset": 1}]}))
            err = recv_json(ws)  # not assigned here: an error frame, the stream goes on
            assert err["command"] == "commit"
            assert err["error"]["name"] == "UnknownPartitionError"
            ws.send(json.dumps({"type": "commit", "offsets": [{"partition": 0}]}))
            assert "commit offsets must be" in recv_json(ws)["error"]["message"]
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=5)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1008


@pytest.mark.parametrize(
    ("topic", "query", "code", "words"),
    [
        ("nope", "", 4404, "does not exist"),
        ("p", "from=yesterday", 4400, "from='yesterday'"),
        ("p", "credit=-3", 4400, "credit='-3'"),
        ("p", "batch=5000", 4400, "batch='5000'"),
        ("p", "encoding=hex", 4400, "encoding='hex'"),
        ("p", "partitions=0,9", 4404, "not 9"),
        ("p", "group=g&from=offset:3", 4400, "earliest or latest"),
        ("p", "group=g&partitions=0", 4400, "not allowed with a group"),
    ],
)
def test_bad_parameters_close_with_a_specific_code(
    tmp_path: Path, topic: str, query: str, code: int, words: str
) -> None:
    with gateway(tmp_path) as eb:
        create(eb, "p")
        with open_ws(eb, topic, query) as ws:
            err = recv_json(ws)
            assert words in err["error"]["message"], err
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=5)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == code


def test_a_draining_gateway_closes_streams_as_going_away(tmp_path: Path) -> None:
    with contextlib.ExitStack() as outer:
        with gateway(tmp_path) as eb:
            create(eb, "d")
            ws = outer.enter_context(open_ws(eb, "d"))
            recv_json(ws)
        # The broker stopped without waiting for the client: the stream was told why.
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=5)
    assert closed.value.rcvd is not None
    # 1001 from the stream; 1012 if the HTTP server's own shutdown got there first.
    assert closed.value.rcvd.code in (1001, 1012)


def test_deleting_the_topic_closes_its_streams_with_4404(tmp_path: Path) -> None:
    with gateway(tmp_path) as eb:
        create(eb, "gone")
        produce(eb, "gone", [b"one"])
        with open_ws(eb, "gone", "from=earliest") as ws:
            recv_json(ws)
            assert recv_messages(ws, 1)[0]["value"] == "one"
            with Client(eb.addr) as c:
                c.delete_topic("gone")
            err = recv_json(ws)
            assert err["error"]["name"] == "UnknownTopicError"
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=5)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 4404


def test_a_websocket_and_a_binary_protocol_member_share_a_group(tmp_path: Path) -> None:
    with gateway(tmp_path) as eb:
        create(eb, "mixed", partitions=2)
        with open_ws(eb, "mixed", "group=both&from=earliest") as ws:
            assert len(recv_json(ws)["partitions"]) == 2
            with GroupConsumer(
                eb.addr, "both", topics=["mixed"], auto_offset_reset="earliest"
            ) as member:
                member.poll(0.5)  # joins; the socket's member rejoins within its heartbeat
                assigned = recv_json(ws)
                assert assigned["type"] == "assigned"
                mine = {p["partition"] for p in assigned["partitions"]}
                deadline = time.monotonic() + PROMPT_S
                while not member.assignment() and time.monotonic() < deadline:
                    member.poll(0.1)
                theirs = {p for _, p in member.assignment()}
                assert mine | theirs == {0, 1}
                assert not mine & theirs


def test_no_first_credit_waits_for_a_grant(tmp_path: Path) -> None:
    with gateway(tmp_path) as eb:
        create(eb, "z")
        produce(eb, "z", [b"1", b"2"])
        with open_ws(eb, "z", "from=earliest&credit=0") as ws:
            assert recv_json(ws)["credit"]["messages"] == 0
            with pytest.raises(TimeoutError):
                ws.recv(timeout=QUIET_S)
            ws.send(json.dumps({"type": "credit", "messages": 1}))
            assert recv_messages(ws, 1)[0]["value"] == "1"
            with pytest.raises(TimeoutError):
                ws.recv(timeout=QUIET_S)
