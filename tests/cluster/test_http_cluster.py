"""The HTTP API on a cluster: three real ``tidewire serve --cluster --http-port`` processes.
A publish sent to a node that does not lead its partition is forwarded to the leader and
stored there once (node 3 runs with ``--http-cluster-routing redirect`` and answers 307 to
the leader's HTTP listener instead); an unkeyed message is stored in a partition of the node
it arrived at; a read is answered by any node holding a replica, and forwarded to the leader
(node 3: redirected) by one that holds none; a batch whose partitions have different
leaders is refused before anything is stored. Streams (SSE, WebSocket) and the read over
every partition carry the partitions other nodes lead; a group is committed, described and
listed through any node; a publish with an Idempotency-Key retried through every node is
stored once. About 12 s (3 node starts)."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect as ws_connect

from tests.cli._support import popen_serve, stop
from tests.cluster._etcd import EtcdServer
from tests.cluster._inprocess import InProcessNode, in_process_cluster, stop_for_next_leader, until
from tests.cluster._nodes import call, wait_until
from tidewire.client._routing import OFFSETS_TOPIC, coordinator_partition
from tidewire.cluster.metadata import PartitionState
from tidewire.errors import NotLeaderError
from tidewire.protocol.messages import (
    CreateTopicRequest,
    MetadataRequest,
    MetadataResponse,
    OffsetFetchRequest,
)
from tidewire.server.http.idempotency import IdempotencyStore
from tidewire.server.http.models import PublishMessage
from tidewire.server.http.publisher import Publisher
from tidewire.storage import LogConfig

NODES = (1, 2, 3)
WAIT_S = 30.0


#: The node that redirects (307) what the others forward.
REDIRECTS = 3


def _start(data: Path, cluster: str, n: int) -> tuple[subprocess.Popen[str], int, int, int]:
    """Node ``n``: its process, protocol port, HTTP port and msgbus port."""
    routing = ("--http-cluster-routing", "redirect") if n == REDIRECTS else ()
    proc = popen_serve(
        *("--data-dir", str(data), "--port", "0", "--http-port", "0", "--node-id", str(n)),
        *("--http-msgbus-port", "0", "--cluster", cluster, "--session-timeout", "3"),
        *routing,
    )
    assert proc.stdout is not None
    native = http = msgbus = None
    for _ in range(8):
        line = proc.stdout.readline()
        if m := re.search(r"listening on 127\.0\.0\.1:(\d+)", line):
            native = native or int(m.group(1))
        if m := re.search(r"HTTP native listening on http://127\.0\.0\.1:(\d+)", line):
            http = int(m.group(1))
        if m := re.search(r"HTTP msgbus listening on http://127\.0\.0\.1:(\d+)", line):
            msgbus = int(m.group(1))
        if native and http and msgbus:
            return proc, native, http, msgbus
    stop(proc)
    pytest.fail(f"node {n} did not start")


def test_the_http_api_answers_from_any_node(tmp_path: Path, etcd: EtcdServer) -> None:
    cluster = f"etcd://127.0.0.1:{etcd.client_port}"
    procs, native, http, msgbus = {}, {}, {}, {}
    try:
        for n in NODES:
            procs[n], native[n], http[n], msgbus[n] = _start(tmp_path / f"node{n}", cluster, n)
        addr = {n: f"127.0.0.1:{native[n]}" for n in NODES}

        def meta() -> MetadataResponse:
            got = asyncio.run(call(addr[1], MetadataRequest()))
            assert isinstance(got, MetadataResponse)
            return got

        wait_until("3 nodes registered", lambda: len(meta().nodes) == 3, WAIT_S)
        for name, rf in (("r3", 3), ("r1", 1)):
            answer = asyncio.run(
                call(addr[1], CreateTopicRequest(name=name, partitions=3, replication_factor=rf))
            )
            assert getattr(answer, "error_code", 0) == 0, answer

        def leaders(name: str) -> dict[int, int]:
            (t,) = [t for t in meta().topics if t.name == name]
            return {p.partition: p.leader for p in t.partitions}

        wait_until("leaders", lambda: all(v > 0 for v in leaders("r3").values()), WAIT_S)

        def everywhere() -> bool:  # every node's copy of the metadata has both topics
            return all(
                {"r1", "r3"}
                <= {t.name for t in asyncio.run(call(addr[n], MetadataRequest())).topics}  # type: ignore[attr-defined]
                for n in NODES
            )

        wait_until("both topics on every node", everywhere, WAIT_S)
        lead3, lead1 = leaders("r3"), leaders("r1")
        url = {n: f"http://127.0.0.1:{http[n]}" for n in NODES}
        with httpx.Client(timeout=WAIT_S) as web:
            # A partition led elsewhere: forwarded to the leader, answered as it answers; on
            # the redirecting node, 307 to the leader's HTTP listener, same path.
            p = 0
            other = next(n for n in NODES if n != lead3[p])
            r = web.post(f"{url[other]}/v1/topics/r3/messages", json={"value": "a", "partition": p})
            if other == REDIRECTS:
                assert r.status_code == 307, r.text
                assert r.headers["location"] == f"{url[lead3[p]]}/v1/topics/r3/messages"
                assert r.json()["error"]["name"] == "NotLeaderError"
                r = web.post(
                    f"{url[other]}/v1/topics/r3/messages",
                    json={"value": "a", "partition": p},
                    follow_redirects=True,
                )
            assert r.status_code == 201, r.text
            assert r.json() == {"partition": p, "offset": 0}
            # Unkeyed, no partition: stored where it arrived (a partition this node leads).
            for n in NODES:
                r = web.post(f"{url[n]}/v1/topics/r3/messages", json={"value": f"from {n}"})
                assert r.status_code == 201, r.text
                assert lead3[r.json()["partition"]] == n
            # Reads: any replica answers; a node without one redirects to the leader.
            follower = next(n for n in NODES if n != lead3[0])
            r = web.get(f"{url[follower]}/v1/topics/r3/partitions/0/messages?offset=0")
            assert r.status_code == 200, r.text
            assert [m["value"] for m in r.json()["messages"]][:1] == ["a"]
            r = web.post(
                f"{url[lead1[1]]}/v1/topics/r1/messages", json={"value": "b", "partition": 1}
            )
            assert r.status_code == 201, r.text
            stranger = next(n for n in NODES if n != lead1[1])
            for n in NODES:
                if n == lead1[1]:
                    continue
                r = web.get(f"{url[n]}/v1/topics/r1/partitions/1/messages?offset=0")
                if n == REDIRECTS:
                    assert r.status_code == 307, r.text
                    assert r.headers["location"] == (
                        f"{url[lead1[1]]}/v1/topics/r1/partitions/1/messages?offset=0"
                    )
                    r = web.get(
                        f"{url[n]}/v1/topics/r1/partitions/1/messages?offset=0",
                        follow_redirects=True,
                    )
                assert r.status_code == 200, r.text
                assert [m["value"] for m in r.json()["messages"]] == ["b"]
            # A batch over partitions of different leaders: refused, nothing stored.
            if len(set(lead3.values())) > 1:
                r = web.post(
                    f"{url[1]}/v1/topics/r3/messages:batch",
                    json={"messages": [{"value": "x", "partition": p} for p in range(3)]},
                )
                assert r.status_code == 400, r.text
                assert "led by different nodes" in r.json()["error"]["message"]
            # Topics made and deleted over HTTP go through etcd: every node knows them.
            r = web.post(
                f"{url[2]}/v1/topics",
                json={"name": "web", "partitions": 2, "replication_factor": 3},
            )
            assert r.status_code == 201, r.text
            made = r.json()
            assert made["replication_factor"] == 3
            assert [len(p["replicas"]) for p in made["partitions"]] == [3, 3]
            wait_until(
                "the HTTP topic on every node",
                lambda: all(
                    "web" in {t.name for t in asyncio.run(call(addr[n], MetadataRequest())).topics}  # type: ignore[attr-defined]
                    for n in NODES
                ),
                WAIT_S,
            )
            listed = web.get(f"{url[1]}/v1/topics").json()
            assert {t["name"]: t["partitions"] for t in listed["topics"]} == {
                "r1": 3,
                "r3": 3,
                "web": 2,
            }
            # A topic described by a node holding only some of its replicas: every partition.
            described = web.get(f"{url[stranger]}/v1/topics/r1").json()
            assert [p["partition"] for p in described["partitions"]] == [0, 1, 2]
            assert {p["leader"] for p in described["partitions"]} == set(lead1.values())
            assert described["replication_factor"] == 1
            # Altered over HTTP through etcd too: more partitions, other cluster settings.
            r = web.patch(
                f"{url[3]}/v1/topics/web",
                json={"partitions": 3, "min_insync_replicas": 2, "config": {"retention_ms": 9000}},
            )
            assert r.status_code == 200, r.text
            altered = r.json()
            assert len(altered["partitions"]) == 3
            assert altered["min_insync_replicas"] == 2
            assert altered["config"]["retention_ms"] == 9000
            r = web.patch(f"{url[1]}/v1/topics/web", json={"min_insync_replicas": 4})
            assert r.status_code == 400, r.text  # above the replication factor
            r = web.delete(f"{url[3]}/v1/topics/web")
            assert r.status_code == 204, r.text
            wait_until(
                "the HTTP topic gone from every node",
                lambda: all(
                    "web"
                    not in {t.name for t in asyncio.run(call(addr[n], MetadataRequest())).topics}  # type: ignore[attr-defined]
                    for n in NODES
                ),
                WAIT_S,
            )
            # Unknown topic in the cluster: 404 naming the way out.
            r = web.post(f"{url[1]}/v1/topics/nope/messages", json={"value": "x"})
            assert r.status_code == 404
            assert "create it first" in r.json()["error"]["message"]
        _reads_streams_groups_from_any_node(addr, url)
        _msgbus_from_any_node(addr, {n: f"127.0.0.1:{msgbus[n]}" for n in NODES})
        counts = {
            p.partition: p.log_end_offset
            for t in asyncio.run(call(addr[lead3[0]], MetadataRequest(topics=["r3"]))).topics  # type: ignore[attr-defined]
            for p in t.partitions
            if p.partition == 0
        }
        assert counts[0] >= 1  # the redirected message once (and any unkeyed that landed there)
    finally:
        for proc in procs.values():
            stop(proc)


def _sse_messages(web: httpx.Client, url: str, n: int) -> list[dict[str, Any]]:
    """The first ``n`` message events of an SSE stream at ``url`` (bounded: the read timeout
    of ``web`` ends a stream that stalls)."""
    out: list[dict[str, Any]] = []
    with web.stream("GET", url, headers={"Accept": "text/event-stream"}) as r:
        assert r.status_code == 200, r.read()
        event = ""
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[len("event: ") :]
            elif line.startswith("data: "):
                assert event == "message", line
                out.append(json.loads(line[len("data: ") :]))
                if len(out) == n:
                    return out
    raise AssertionError(f"the stream ended after {len(out)} of {n} messages")


def _reads_streams_groups_from_any_node(addr: dict[int, str], url: dict[int, str]) -> None:
    """A topic of 3 partitions, one replica each, on 3 nodes (so each node holds one of
    them): SSE and WebSocket streams opened on one node carry the messages of partitions led
    by the others; the read over every partition answers them all on any node; a keyed
    publish retried through every node is stored once; a group's commit, description and
    listing work through any node."""

    def meta(n: int) -> MetadataResponse:
        got = asyncio.run(call(addr[n], MetadataRequest()))
        assert isinstance(got, MetadataResponse)
        return got

    for name, parts, rf in (("t", 3, 1), ("g3", 1, 3)):
        answer = asyncio.run(
            call(addr[1], CreateTopicRequest(name=name, partitions=parts, replication_factor=rf))
        )
        assert getattr(answer, "error_code", 0) == 0, answer

    def leaders(n: int) -> dict[int, int]:
        return {
            p.partition: p.leader for t in meta(n).topics if t.name == "t" for p in t.partitions
        }

    wait_until(
        "every node knows the leaders",
        lambda: all(len(leaders(n)) == 3 and min(leaders(n).values()) > 0 for n in NODES),
        WAIT_S,
    )
    lead = leaders(1)
    with httpx.Client(timeout=WAIT_S, follow_redirects=True) as web:
        for p in range(3):
            r = _until_ok(
                lambda p=p: web.post(
                    f"{url[1]}/v1/topics/t/messages", json={"value": f"v{p}", "partition": p}
                )
            )
            assert r.status_code == 201, r.text
        expected = {(p, f"v{p}") for p in range(3)}
        # The read over every partition, on each node: the others' partitions from their
        # leaders.
        for n in NODES:
            r = web.get(f"{url[n]}/v1/topics/t/messages?since=0", follow_redirects=False)
            assert r.status_code == 200, r.text
            got = {(m["partition"], m["value"]) for m in r.json()["messages"]}
            assert got == expected, (n, got)
            assert r.json()["next_offsets"] == {"0": 1, "1": 1, "2": 1}
        # An SSE stream on a node that leads one partition (or none) carries all three;
        # a message published after it opened arrives too (the remote long poll).
        n = lead[0]
        events = _sse_messages(web, f"{url[n]}/v1/topics/t/stream?from=earliest", 3)
        assert {(m["partition"], m["value"]) for m in events} == expected
        # ... and resumes from the last event's position (the others' from their leaders).
        # WebSocket, on another node: everything, then what is published meanwhile.
        m = lead[1]
        ws_base = url[m].replace("http://", "ws://")
        with ws_connect(f"{ws_base}/v1/topics/t/stream?from=earliest", open_timeout=WAIT_S) as ws:
            assert json.loads(ws.recv(timeout=WAIT_S))["type"] == "subscribed"
            seen: set[tuple[int, str]] = set()
            while len(seen) < 3:
                msg = json.loads(ws.recv(timeout=WAIT_S))
                seen.add((msg["partition"], msg["value"]))
            assert seen == expected
            other = next(p for p in range(3) if lead[p] != m)
            r = web.post(
                f"{url[m]}/v1/topics/t/messages", json={"value": "late", "partition": other}
            )
            assert r.status_code == 201, r.text
            msg = json.loads(ws.recv(timeout=WAIT_S))
            assert (msg["partition"], msg["value"]) == (other, "late")
        # An Idempotency-Key without a message key or partition: the key's partition, so
        # a retry sent to any node reaches the same leader, which stores it once.
        first = None
        for n in NODES:
            r = web.post(
                f"{url[n]}/v1/topics/t/messages",
                json={"value": "once"},
                headers={"Idempotency-Key": "k-1"},
            )
            assert r.status_code == 201, r.text
            first = first or r.json()
            assert r.json() == first
        r = web.get(f"{url[1]}/v1/topics/t/messages?since=0&limit=100")
        assert [m["value"] for m in r.json()["messages"]].count("once") == 1
        # A consumer group over HTTP through every node: forwarded to its coordinator (by
        # node 3, redirected there).
        # (Of a topic every node holds: the coordinator describes the end offsets of the
        # partitions it holds a replica of.)
        followed = []
        for i, n in enumerate(NODES):
            body = {"offsets": [{"topic": "g3", "partition": 0, "offset": i + 1}]}
            r = _until_ok(
                lambda n=n, body=body: web.post(f"{url[n]}/v1/groups/g/commit", json=body)
            )
            assert r.status_code == 200, r.text
            if r.history:
                followed.append(n)
            d = web.get(f"{url[n]}/v1/groups/g")
            assert d.status_code == 200, d.text
            assert [o["committed"] for o in d.json()["offsets"]] == [i + 1]
        got = asyncio.run(call(addr[1], MetadataRequest(topics=[OFFSETS_TOPIC])))
        assert isinstance(got, MetadataResponse)
        (offsets,) = got.topics
        coordinator = offsets.partitions[coordinator_partition("g")].leader
        assert followed == ([REDIRECTS] if coordinator != REDIRECTS else [])
        redirected = [n for n in NODES if n != coordinator]  # sent it there
        for n in NODES:
            listed = web.get(f"{url[n]}/v1/groups", follow_redirects=False)
            assert listed.status_code == 200, listed.text
            assert [g["group"] for g in listed.json()["groups"]] == ["g"]
        # A WebSocket member of the group on a node that does not coordinate it: it joins,
        # is given the partition (the only member) from the committed offset 3, and commits,
        # through the coordinator. (A topic every node holds: a coordinator assigns the
        # partitions of the topics it holds, see docs/cluster.md.)
        for i in range(5):
            r = web.post(f"{url[1]}/v1/topics/g3/messages", json={"value": f"m{i}"})
            assert r.status_code == 201, r.text
        n = redirected[0]
        ws_base = url[n].replace("http://", "ws://")
        with ws_connect(f"{ws_base}/v1/topics/g3/stream?group=g", open_timeout=WAIT_S) as ws:
            hello = json.loads(ws.recv(timeout=WAIT_S))
            assert hello["type"] == "subscribed", hello
            assert hello["partitions"] == [{"partition": 0, "offset": 3}]
            values = [json.loads(ws.recv(timeout=WAIT_S))["value"] for _ in range(2)]
            assert values == ["m3", "m4"]
            ws.send(json.dumps({"type": "commit"}))
            done = json.loads(ws.recv(timeout=WAIT_S))
            assert done == {"type": "committed", "offsets": [{"partition": 0, "offset": 5}]}
        got = asyncio.run(call(addr[coordinator], OffsetFetchRequest(group_id="g")))
        assert [(o.topic, o.partition, o.offset) for o in got.offsets] == [("g3", 0, 5)]  # type: ignore[attr-defined]


def _msgbus_from_any_node(addr: dict[int, str], bus: dict[int, str]) -> None:
    """The msgbus mode on a cluster: a topic made on first publish through etcd (one
    replica); a subscriber on a node without it gets what is published through a third node
    (forwarded to the leader); pops on any node are taken by the leader, once each; every node
    lists the cluster's msgbus topics."""
    with httpx.Client(timeout=WAIT_S) as web:
        r = web.post(f"http://{bus[1]}/news", content=b"first")
        assert r.status_code == 202, r.text
        assert r.text.endswith("with sequence 1")
        wait_until(
            "every node knows msgbus.news",
            lambda: all(
                any(
                    t.name == "msgbus.news" and t.partitions[0].leader > 0
                    for t in asyncio.run(call(addr[n], MetadataRequest())).topics
                )  # type: ignore[attr-defined]
                for n in NODES
            ),
            WAIT_S,
        )
        (desc,) = [
            t
            for t in asyncio.run(call(addr[1], MetadataRequest())).topics  # type: ignore[attr-defined]
            if t.name == "msgbus.news"
        ]
        leader = desc.partitions[0].leader
        others = [n for n in NODES if n != leader]
        replicas = set(desc.partitions[0].replicas)
        # A subscriber on a node that does not lead the topic (it reads from the leader), a
        # publish through the other one (forwarded to the leader).
        sub_node = next((n for n in others if n not in replicas), others[0])
        pub_node = next(n for n in others if n != sub_node)
        with ws_connect(f"ws://{bus[sub_node]}/news", open_timeout=WAIT_S) as ws:
            r = web.put(f"http://{bus[pub_node]}/news", content=b"second")
            assert r.status_code == 202, r.text
            assert r.text.endswith("with sequence 2")
            got = json.loads(ws.recv(timeout=WAIT_S))
            assert base64.b64decode(got["payload"]) == b"second"
            assert got["id"] == 1
        # The cluster's msgbus topics on every node (seq: the high watermark the node knows,
        # from its replica, or from the leader when it holds none).
        for n in NODES:
            assert list(web.get(f"http://{bus[n]}/").json()) == ["news"]
            wait_until(
                f"msgbus.news listed with seq 2 on node {n}",
                lambda n=n: web.get(f"http://{bus[n]}/").json()["news"]["seq"] == 2,
                WAIT_S,
            )
        # Pops on any node are taken by the leader, once each.
        popped = [web.get(f"http://{bus[n]}/news") for n in (pub_node, sub_node, leader)]
        assert [p.status_code for p in popped] == [200, 200, 404]
        assert [base64.b64decode(p.json()["payload"]) for p in popped[:2]] == [b"first", b"second"]


def _until_ok(send: Callable[[], httpx.Response]) -> httpx.Response:
    """``send()`` again while it answers 503 (a cluster making its offsets topic on first
    use), for up to WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while True:
        r = send()
        if r.status_code != 503 or time.monotonic() > deadline:
            return r
        time.sleep(0.1)


class _Node(InProcessNode):
    """An in-process node with a session long enough for a loaded machine (its stop revokes
    its lease: the others see it gone at once)."""

    def __init__(self, tmp: Path, etcd: EtcdServer, node_id: int) -> None:
        super().__init__(tmp, etcd, node_id, cluster_id="http-keys", session_s=10)


def test_an_idempotency_key_is_found_by_a_new_leader(tmp_path: Path, etcd: EtcdServer) -> None:
    """A publish with an Idempotency-Key stored on a partition's leader, then retried on the
    node that leads it next, is answered with the first offsets and stored once, also when
    that node had read the topic's keys back before (as a follower, for another request):
    a new leader reads its partitions' keys back once per leader epoch. In-process nodes, the
    gateway's publisher of each (no HTTP listener needed). About 5 s."""

    async def main() -> None:
        async with in_process_cluster(lambda i: _Node(tmp_path, etcd, i)) as nodes:
            first = nodes[0].cluster
            await first.create_topic("k", 1, LogConfig(), 3)

            def state() -> PartitionState | None:
                got = first.cache.partition("k", 0)
                return None if got is None else got[0]

            await until(
                lambda: (s := state()) is not None and len(s.isr) == 3, "the ISR is complete"
            )
            by_id = {n.id: n for n in nodes}
            publishers = {n.id: Publisher(n.broker, IdempotencyStore(n.broker)) for n in nodes}
            leader = by_id[state().leader]  # type: ignore[union-attr]
            await until(lambda: leader.broker.replication.leads("k", 0), "the leader leads")  # type: ignore[union-attr]
            msg = [PublishMessage(value="once")]
            # The followers read the topic's keys back for a request of their own (refused:
            # they do not lead it) before the key below is stored.
            for n in nodes:
                if n is not leader:
                    with pytest.raises(NotLeaderError):
                        await publishers[n.id].publish("k", msg, "utf-8", "other")
            stored = await publishers[leader.id].publish("k", msg, "utf-8", "the-key")
            # Every in-sync replica holds it once it is answered (min_insync 2, acks all).
            new = await stop_for_next_leader(nodes, leader, "k")
            again = await publishers[new.id].publish("k", msg, "utf-8", "the-key")
            assert again == stored
            plog = new.broker.log("k", 0)
            assert plog.log_end_offset == stored[0][1] + 1  # stored once

    asyncio.run(asyncio.wait_for(main(), 120))
