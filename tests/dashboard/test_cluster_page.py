"""The dashboard's Cluster page in a real browser, on three real ``tidewire serve --cluster
--http-port`` processes and etcd: listed only on a node of a cluster, it shows the
controller, the live nodes and every partition; when a node is killed, the page shows it gone
and its partitions under-replicated among those that need attention. On a single node the
page is not listed (the default tier's check; the cluster one, ~13 s, is in the slow tier).
The moves in progress are drawn from what GET /v1/cluster/reassignments answers, and the
whole cluster's figures (a totals row, a row per node, the nodes that did not answer named)
from what GET /v1/cluster/metrics answers (the default tier: the page's routes answered by
the test, with a move in the middle of its first step and a node that did not answer; the
routes' own answers are tested in tests/cluster/test_cluster_metrics.py; the slow tier's
three nodes show their figures too).
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
        # The whole cluster's figures: the totals and every node's row (each node answered).
        figures = p.locator("#cluster-figures-table")
        expect(figures.locator("tr[data-kind=total]")).to_have_count(1)
        expect(figures.locator("tr[data-kind=node]")).to_have_count(3)
        expect(figures.locator("tr[data-kind=missing]")).to_have_count(0)
        # The totals' partitions led: orders' 2 and __audit.1, whoever leads them.
        expect(figures.locator("tr[data-kind=total] td").nth(7)).to_have_text("3")

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


def _node_figures(node_id: int, **figures: Any) -> dict[str, Any]:
    """One node's figures as GET /v1/cluster/metrics lists them (zeros unless given)."""
    doc: dict[str, Any] = {
        "node_id": node_id,
        "messages_in": 0,
        "messages_out": 0,
        "bytes_in": 0,
        "bytes_out": 0,
        "disk_used_bytes": 0,
        "messages_in_per_s": None,
        "bytes_in_per_s": None,
        "bytes_out_per_s": None,
        "partitions_led": 0,
        "under_replicated_partitions": 0,
        "under_min_isr_partitions": 0,
        "reassigning_partitions": 0,
        "offline_partitions": -1,
        "controller": False,
        "isr_shrinks": 0,
        "isr_expands": 0,
        "leader_elections": 0,
        "replica_fetch_errors": 0,
        "lease_losses": 0,
        "lease_stale": False,
        "lease_stale_periods": 0,
    }
    doc.update(figures)
    return doc


def _figures(nodes: list[dict[str, Any]], missing: list[int]) -> dict[str, Any]:
    """What node 1 answers to GET /v1/cluster/metrics for ``nodes``, the totals summed by
    the server's own code (so the page shows what the route would)."""
    from tidewire.cluster.metrics import cluster_totals
    from tidewire.protocol.messages import NodeMetricsBody

    totals = cluster_totals([NodeMetricsBody(**n) for n in nodes])
    return {"node_id": 1, "totals": totals, "nodes": nodes, "missing_nodes": missing}


#: Node 1 (the controller) and node 2 answered; node 3 did not.
_FIGURES = _figures(
    [
        _node_figures(
            1,
            controller=True,
            offline_partitions=0,
            messages_in=1000,
            messages_in_per_s=250.5,
            bytes_in_per_s=2048.0,
            partitions_led=2,
            under_replicated_partitions=1,
        ),
        _node_figures(
            2,
            messages_in=500,
            messages_in_per_s=100.0,
            partitions_led=1,
            isr_shrinks=2,
            lease_stale=True,
            lease_stale_periods=1,
        ),
    ],
    [3],
)


def _answer_cluster_routes(page: Page, answers: dict[str, Any]) -> None:
    """Answer the Cluster page's routes from ``answers`` (path -> JSON, or an int: that
    status with an error body), read at each request so a test can change them."""

    def answer(route: Any) -> None:
        path = re.sub(r"^https?://[^/]+", "", route.request.url).split("?")[0]
        doc = answers[path]
        if isinstance(doc, int):
            body = {"error": {"message": "no describe on the cluster"}}
            route.fulfill(status=doc, content_type="application/json", body=json.dumps(body))
            return
        route.fulfill(status=200, content_type="application/json", body=json.dumps(doc))

    page.page.route(re.compile(r".*/v1/cluster(/partitions|/reassignments|/metrics)?$"), answer)


def _cluster_page(page: Page, figures: Any = _FIGURES) -> tuple[Any, dict[str, Any]]:
    """The Cluster page opened with its routes answered from this file's documents
    (``figures``: GET /v1/cluster/metrics's), and those answers, which a test can change."""
    answers: dict[str, Any] = {
        "/v1/cluster": _CLUSTER,
        "/v1/cluster/partitions": _PARTITIONS,
        "/v1/cluster/reassignments": _MOVES,
        "/v1/cluster/metrics": figures,
    }
    _answer_cluster_routes(page, answers)
    return page.go("cluster"), answers


def test_the_cluster_page_shows_the_whole_clusters_figures(page: Page) -> None:
    expect = _expect()
    p, answers = _cluster_page(page)
    figures = p.locator("#cluster-figures-table")
    total = figures.locator("tr[data-kind=total]")
    expect(total).to_have_count(1)
    expect(total).to_contain_text("All nodes")
    # The totals row: messages in per second and in all, partitions led, under-replicated,
    # ISR shrinks, and one node's lease stale.
    expect(total).to_contain_text("350.5")
    expect(total).to_contain_text("1,500")
    cells = total.locator("td")
    expect(cells.nth(7)).to_have_text("3")
    expect(cells.nth(8)).to_have_text("1")
    expect(cells.nth(10)).to_have_text("2")
    expect(total).to_contain_text("1 stale")
    # A row per node that answered, this one first; the one that did not named.
    rows = figures.locator("tr[data-kind=node]")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_have_attribute("data-node", "1")
    expect(rows.nth(0)).to_contain_text("node 1 (this one), controller")
    expect(rows.nth(0)).to_contain_text("250.5")
    expect(rows.nth(0)).to_contain_text("2.0 KiB")
    expect(rows.nth(0)).to_contain_text("fresh")
    expect(rows.nth(1)).to_have_attribute("data-node", "2")
    expect(rows.nth(1)).to_contain_text("stale")
    # Node 2 keeps no samples for bytes: not known, not zero.
    expect(rows.nth(1).locator("td").nth(2)).to_have_text("\u2013")
    missing = figures.locator("tr[data-kind=missing]")
    expect(missing).to_have_count(1)
    expect(missing).to_have_attribute("data-node", "3")
    expect(missing).to_contain_text("no answer")
    expect(p.locator("#cluster-figures")).to_contain_text(
        "Did not answer within 5 s, left out of the totals: node 3."
    )
    # Refreshed like the rest: node 3 answers again, and the totals count it.
    answers["/v1/cluster/metrics"] = _figures(
        [*_FIGURES["nodes"], _node_figures(3, messages_in=250, partitions_led=4)], []
    )
    expect(figures.locator("tr[data-kind=node]")).to_have_count(3, timeout=WAIT_MS)
    expect(figures.locator("tr[data-kind=missing]")).to_have_count(0)
    expect(p.locator("#cluster-figures")).not_to_contain_text("Did not answer")
    expect(figures.locator("tr[data-kind=total] td").nth(7)).to_have_text("7")
    expect(figures.locator("tr[data-kind=total]")).to_contain_text("1,750")
    page.assert_clean()


def test_the_cluster_page_without_the_figures_shows_the_rest(page: Page) -> None:
    """A refused GET /v1/cluster/metrics (403) is said where the figures go; the nodes and
    partitions are drawn all the same."""
    expect = _expect()
    p, _ = _cluster_page(page, figures=403)
    expect(p.locator("#cluster-figures")).to_contain_text(
        "The cluster's figures (GET /v1/cluster/metrics): refused: no permission"
    )
    expect(p.locator("#cluster-figures-table")).to_have_count(0)
    expect(p.locator("#cluster-node-table tr[data-node='2']")).to_have_count(1)
    expect(p.locator("#cluster-partition-table tr[data-topic=orders]")).to_have_count(1)
    expect(p.locator("#cluster-reassigning")).to_have_text("1")
    # (No assert_clean: the browser logs the refused request itself.)


def test_the_cluster_page_shows_the_moves_in_progress(page: Page) -> None:
    expect = _expect()
    p, answers = _cluster_page(page)
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
