"""The dashboard's Cluster page in a real browser, on three real ``tidewire serve --cluster
--http-port`` processes and etcd: listed only on a node of a cluster, it shows the
controller, the live nodes and every partition; when a node is killed, the page shows it gone
and its partitions under-replicated among those that need attention. On a single node the
page is not listed (the default tier's check; the cluster one, ~13 s, is in the slow tier).
The moves in progress are drawn from what GET /v1/cluster/reassignments answers (the
default tier: the page's three routes answered by the test, with a move in the middle of
its first step; the routes' own answers are tested in tests/cluster/test_cluster_metrics.py).
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.cli._support import stop
from tests.cluster._etcd import EtcdServer, etcd
from tests.cluster._nodes import call, serve_with_http, wait_until
from tests.dashboard.conftest import TIMEOUT_MS, Page, open_page
from tidewire.protocol.messages import CreateTopicRequest

__all__ = ["etcd"]  # the real-etcd fixture, used here too

NODES = (1, 2, 3)
#: Generous for a loaded 2-core machine: a killed node's lease (3 s) runs out, then the page
#: refreshes (every 3 s).
WAIT_MS = 45_000


def _expect() -> Any:
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    return expect


@pytest.fixture
def nodes(
    tmp_path: Path, etcd: EtcdServer
) -> Iterator[dict[int, tuple[subprocess.Popen[str], str]]]:
    """Three nodes (process, HTTP base URL), always stopped; a topic of 2 partitions, each
    on every node."""
    cluster = f"etcd://127.0.0.1:{etcd.client_port}"
    procs: dict[int, tuple[subprocess.Popen[str], str]] = {}
    addr = ""
    try:
        for n in NODES:
            proc, native, port = serve_with_http(tmp_path / f"node{n}", cluster, n)
            procs[n] = (proc, f"http://127.0.0.1:{port}")
            addr = addr or f"127.0.0.1:{native}"
        with httpx.Client(base_url=procs[1][1], timeout=30) as c:

            def registered() -> bool:
                r = c.get("/v1/cluster")
                return r.status_code == 200 and sum(x["live"] for x in r.json()["nodes"]) == 3

            wait_until("3 nodes registered", registered, 30)
        # Through the binary protocol (CREATE_TOPIC goes through etcd); replicated on every
        # node: the default replication factor (3) over 3 nodes.
        # (In a thread of its own: Playwright's loop runs in this one.)
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(
                asyncio.run, call(addr, CreateTopicRequest(name="orders", partitions=2))
            ).result(60)
        assert getattr(answer, "error_code", 0) == 0, answer
        yield procs
    finally:
        for proc, _ in procs.values():
            stop(proc)


@pytest.mark.slow  # ~13 s: three nodes start, and a killed one's lease runs out
def test_the_cluster_page_follows_a_node_that_goes(
    browser: Any, nodes: dict[int, tuple[subprocess.Popen[str], str]]
) -> None:
    expect = _expect()
    for page in open_page(browser, nodes[1][1]):
        p = page.go("cluster")
        expect(p.locator("#nav-cluster")).to_be_visible()
        expect(p.locator("#cluster-nodes-live")).to_have_text("3")
        # orders' 2 partitions and node 1's audit log (__audit.1, made by the audited
        # CREATE_TOPIC: docs/cluster.md, "Security").
        expect(p.locator("#cluster-total")).to_have_text("3", timeout=WAIT_MS)
        for n in NODES:
            expect(p.locator(f"#cluster-node-table tr[data-node='{n}']")).to_have_attribute(
                "data-live", "true"
            )
        expect(p.locator("#cluster-controller")).to_contain_text("node ")
        rows = p.locator("#cluster-partition-table tr[data-topic=orders]")
        expect(rows).to_have_count(2)
        expect(p.locator("#cluster-attention-table")).to_contain_text("none: every partition")

        # Node 3 is killed: once its lease runs out it is gone, and both partitions are
        # under-replicated (they had a replica on it).
        stop(nodes[3][0])
        expect(p.locator("#cluster-node-table tr[data-node='3']")).to_have_attribute(
            "data-live", "false", timeout=WAIT_MS
        )
        attention = p.locator("#cluster-attention-table tr[data-topic=orders]")
        expect(attention).to_have_count(2, timeout=WAIT_MS)
        for i in range(2):
            expect(attention.nth(i)).to_have_attribute("data-state", "under_replicated")
            expect(attention.nth(i)).not_to_have_attribute("data-isr", re.compile("3"))
        # ... and __audit.1, on every node too.
        expect(p.locator("#cluster-under-replicated")).to_have_text("3")
        page.assert_clean()


def test_a_single_node_lists_no_cluster_page(page: Page) -> None:
    expect = _expect()
    p = page.go("overview")
    expect(p.locator("#nav-kafka")).to_be_visible()
    expect(p.locator("#nav-cluster")).to_have_count(0)
    page.assert_clean()


#: What a node of a cluster answers while a move of orders/0 from node 1 to nodes 1 and 2 is
#: in its first step (node 2 added, copying).
_CLUSTER = {
    "cluster_id": "default",
    "node_id": 1,
    "controller": 1,
    "is_controller": True,
    "topics": 1,
    "nodes": [
        {
            "node_id": n,
            "live": True,
            "host": "127.0.0.1",
            "port": 7400 + n,
            "http_port": None,
            "kafka_port": None,
            "controller": n == 1,
        }
        for n in (1, 2)
    ],
    "partitions": {
        "total": 1,
        "offline": 0,
        "under_replicated": 1,
        "under_min_isr": 0,
        "led_here": 1,
        "led_here_under_replicated": 1,
        "led_here_under_min_isr": 0,
        "reassigning": 1,
    },
}
_PARTITIONS = {
    "node_id": 1,
    "truncated": False,
    "partitions": [
        {
            "topic": "orders",
            "partition": 0,
            "leader": 1,
            "leader_epoch": 0,
            "replicas": [1, 2],
            "isr": [1],
            "min_insync_replicas": 1,
            "state": "under_replicated",
            "high_watermark": 1500,
            "log_end_offset": 1500,
            "follower_lag": {"2": 1234},
            "lag": None,
        }
    ],
}
_MOVES = {
    "node_id": 1,
    "moves": [
        {
            "topic": "orders",
            "partition": 0,
            "leader": 1,
            "leader_epoch": 0,
            "replicas": [1, 2],
            "isr": [1],
            "target": [1, 2],
            "original": [1],
            "adding": [2],
            "removing": [],
            "records_left": 1234,
            "bytes_left": 2048,
        }
    ],
}


def test_the_cluster_page_shows_the_moves_in_progress(page: Page) -> None:
    expect = _expect()
    answers = {
        "/v1/cluster": _CLUSTER,
        "/v1/cluster/partitions": _PARTITIONS,
        "/v1/cluster/reassignments": _MOVES,
    }

    def answer(route: Any) -> None:
        path = re.sub(r"^https?://[^/]+", "", route.request.url).split("?")[0]
        route.fulfill(status=200, content_type="application/json", body=json.dumps(answers[path]))

    page.page.route(re.compile(r".*/v1/cluster(/partitions|/reassignments)?$"), answer)
    p = page.go("cluster")
    expect(p.locator("#cluster-reassigning")).to_have_text("1")
    row = p.locator("#cluster-moves-table tr[data-topic=orders]")
    expect(row).to_have_count(1)
    expect(row).to_have_attribute("data-target", "1, 2")
    expect(row).to_have_attribute("data-adding", "2")
    expect(row).to_contain_text("1,234 records, 2.0 KiB")
    # The move done: the table says none.
    answers["/v1/cluster/reassignments"] = {"node_id": 1, "moves": []}
    expect(p.locator("#cluster-moves-table")).to_contain_text(
        "no partition is being moved", timeout=WAIT_MS
    )
    page.assert_clean()
