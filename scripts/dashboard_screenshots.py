"""Screenshots of every dashboard page (see scripts/dashboard-screenshots)."""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import expect, sync_playwright

from tidewire.embedded import EmbeddedBroker
from tidewire.observability.kafka_metrics import kafka_stats_for
from tidewire.protocol.kafka import ApiKey, ErrorCode
from tidewire.security.config import SecurityConfig
from tidewire.security.model import Acl, Operation, ResourceType
from tidewire.server.http.config import HttpConfig

OUT = Path("docs/images/dashboard")
CHROMIUM = "/usr/bin/chromium"

#: File name -> (route, a selector shown once the page has drawn).
PAGES = {
    "overview": ("overview", "#health"),
    "topics": ("topics", "#topic-list table"),
    "topic": ("topic/orders", "#messages tbody tr"),
    "live-tail": ("tail/orders", "#tail-rows tr:nth-child(8)"),
    "groups": ("groups", "#group-list table"),
    "group": ("group/billing", "#offsets"),
    "queues": ("queues", "#queue-list table"),
    "queue": ("queue/shipments.dead", "#dlq-table tbody tr"),
    "streams": ("streams", "#stream-table tbody tr"),
    "stream": ("stream/chat.room-7", "#stream-info .cards"),
    "kafka": ("kafka", "#kafka-api-table tr[data-api=fetch]"),
    "metrics": ("metrics", "#charts"),
    "settings": ("settings", "#settings"),
    "audit": ("audit", "#audit table"),
    "security": ("security", "#principals"),
}


async def kafka_traffic(eb: EmbeddedBroker, seconds: float) -> None:
    """What a Kafka listener with a few clients would report, fed to the broker's Kafka
    recorder for ``seconds`` (the picture shows the page, not a listener's speed)."""
    st = kafka_stats_for(eb.broker)
    st.listening("0.0.0.0", 9092)
    for _ in range(6):
        st.connection_opened()
    st.authentication(True, "SCRAM-SHA-256")
    st.authentication(False, "PLAIN")
    st.request(ApiKey.API_VERSIONS, 3, 0.0001, ErrorCode.UNSUPPORTED_VERSION)
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        i += 1
        st.request(ApiKey.API_VERSIONS, 2, 0.0001, 0)
        st.request(ApiKey.METADATA, 8, 0.0004, 0)
        for _ in range(40):
            st.request(ApiKey.PRODUCE, 7, 0.0008 + (i % 7) * 0.0004, 0)
            st.bytes_in(1100)
            st.bytes_out(60)
        for _ in range(12):
            st.request(ApiKey.FETCH, 11, 0.002 if i % 5 else 0.45, 0)
            st.bytes_out(16_000)
        st.request(ApiKey.HEARTBEAT, 3, 0.0002, 0)
        st.request(ApiKey.OFFSET_COMMIT, 7, 0.003, 0)
        if i % 20 == 0:
            st.request(ApiKey.PRODUCE, 7, 0.0005, ErrorCode.TOPIC_AUTHORIZATION_FAILED)
            st.request(ApiKey.JOIN_GROUP, 5, 0.002, ErrorCode.MEMBER_ID_REQUIRED)
        await asyncio.sleep(0.1)


def _run(eb: EmbeddedBroker, coro: Any) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, eb.loop).result(30)


def sample_data(eb: EmbeddedBroker, c: httpx.Client) -> None:
    for name, parts in (("orders", 3), ("payments", 2), ("audit-events", 1), ("clicks", 6)):
        c.post("/v1/topics", json={"name": name, "partitions": parts}).raise_for_status()
    for i in range(60):
        c.post(
            "/v1/topics/orders/messages",
            json={
                "key": f"customer-{i % 7}",
                "value": f'{{"order": {1000 + i}, "total": {i * 3.5}}}',
            },
        ).raise_for_status()
    c.post(
        "/v1/topics/payments/messages:batch",
        json={"messages": [{"key": f"p{i}", "value": f"paid {i}"} for i in range(25)]},
    ).raise_for_status()
    c.post(
        "/v1/groups/billing/commit",
        json={"offsets": [{"topic": "orders", "partition": p, "offset": 5} for p in range(3)]},
    ).raise_for_status()
    c.post(
        "/v1/groups/analytics/commit",
        json={"offsets": [{"topic": "payments", "partition": 0, "offset": 3}]},
    ).raise_for_status()
    sample_queues(c)
    sample_streams(c)
    store = eb.broker.security
    _run(eb, store.create_principal("grafana", kind="service", roles=["viewer"]))
    _run(eb, store.create_principal("checkout", kind="service"))
    _run(
        eb,
        store.add_acls(
            [
                Acl(
                    principal="checkout",
                    resource_type=ResourceType.TOPIC,
                    pattern="orders",
                    operation=Operation.WRITE,
                )
            ]
        ),
    )
    _run(eb, store.create_key("checkout"))


def sample_queues(c: httpx.Client) -> None:
    """A topic exchange routing into a work queue with a dead-letter queue, some of whose
    messages were taken, some rejected."""
    c.put("/v1/queues/shipments.dead", json={}).raise_for_status()
    c.put(
        "/v1/queues/shipments",
        json={
            "max_deliveries": 5,
            "dead_letter_exchange": "amq.default",
            "dead_letter_routing_key": "shipments.dead",
        },
    ).raise_for_status()
    c.put("/v1/queues/emails", json={"message_ttl_ms": 3_600_000}).raise_for_status()
    c.put("/v1/exchanges/events", json={"type": "topic"}).raise_for_status()
    for queue, key in (("shipments", "order.*"), ("emails", "#")):
        c.post(
            "/v1/bindings", json={"exchange": "events", "destination": queue, "key": key}
        ).raise_for_status()
    c.post(
        "/v1/exchanges/events/publish",
        json={
            "routing_key": "order.shipped",
            "messages": [{"value": f'{{"shipment": {500 + i}}}'} for i in range(40)],
        },
    ).raise_for_status()
    got = c.post("/v1/queues/shipments/get", json={"max_messages": 6}).json()["messages"]
    c.post("/v1/queues/shipments/ack", json={"tags": [m["tag"] for m in got[:2]]})
    c.post("/v1/queues/shipments/reject", json={"tags": [m["tag"] for m in got[2:5]]})


def sample_streams(c: httpx.Client) -> None:
    """Chat rooms and devices: persistent messages, some in memory, some taken."""
    items: list[dict[str, Any]] = []
    for room in range(12):
        for i in range(room % 4 + 1):
            items.append(
                {
                    "stream": f"chat.room-{room}",
                    "value": f'{{"from": "user-{i}", "text": "hello {i}"}}',
                    "persistent": True,
                }
            )
    for device in range(30):
        items.append({"stream": f"device.{device:04}", "value": f"reading {device}"})
    c.post("/v1/streams/messages", json={"items": items}).raise_for_status()
    c.get("/v1/streams/device.0001/messages", params={"wait_ms": 0}).raise_for_status()


def traffic(url: str, key: str, stop: threading.Event) -> None:
    """A steady trickle of messages, so the charts and the live tail have something."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}) as c:
        i = 0
        while not stop.wait(0.2):
            i += 1
            c.post(
                "/v1/topics/orders/messages",
                json={"key": f"customer-{i % 7}", "value": f'{{"order": {2000 + i}}}'},
            )
            c.post(
                f"/v1/streams/chat.room-{i % 12}/messages",
                json={
                    "value": f'{{"from": "user-{i % 5}", "text": "message {i}"}}',
                    "persistent": True,
                },
            )
            if i % 3 == 0:
                c.get(f"/v1/streams/chat.room-{i % 12}/messages", params={"wait_ms": 0})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--warmup", type=float, default=40.0, help="seconds of traffic first")
    ap.add_argument(
        "--pages",
        nargs="+",
        choices=sorted(PAGES),
        help="only these pages (default: every page, and the sign-in page)",
    )
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        eb = EmbeddedBroker(
            f"{d}/data",
            http_port=0,
            # A sample a second: the charts have points after the short warm-up.
            http=HttpConfig(metrics_sample_interval_s=1.0),
            security=SecurityConfig(authentication=True, superusers="admin"),
        )
        with eb.running() as running:
            assert running.broker.bootstrap_key_file is not None
            key = running.broker.bootstrap_key_file.read_text().strip()
            url = running.http_url
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}) as c:
                sample_data(running, c)
            stop = threading.Event()
            t = threading.Thread(target=traffic, args=(url, key, stop), daemon=True)
            t.start()
            kafka = asyncio.run_coroutine_threadsafe(
                kafka_traffic(running, args.warmup + 120), running.loop
            )
            try:
                time.sleep(args.warmup)
                shoot(url, key, args.pages or list(PAGES), login=not args.pages)
            finally:
                stop.set()
                kafka.cancel()
                t.join()
    shot = len(args.pages) if args.pages else len(PAGES) + 1
    print(f"wrote {shot} screenshots to {OUT}")


def shoot(url: str, key: str, pages: list[str], *, login: bool) -> None:
    expect.set_options(timeout=30_000)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(f"{url}/dashboard#/login")
        expect(page.locator("#api-key")).to_be_visible()
        if login:
            page.screenshot(path=str(OUT / "login.png"))
        page.fill("#api-key", key)
        page.click("#login")
        expect(page.locator("#who")).to_contain_text("signed in")
        for name in pages:
            route, ready = PAGES[name]
            page.goto(f"{url}/dashboard#/{route}")
            expect(page.locator(ready).first).to_be_visible()
            if name == "group":
                page.select_option("#reset-to", "earliest")
                page.click("#reset-dry-run")
                expect(page.locator("#reset-result table")).to_be_visible()
            if name == "stream":
                page.click("#stream-read button[type=submit]")
                expect(page.locator("#stream-read-table tbody tr").first).to_be_visible()
                page.evaluate("window.scrollTo(0, 0)")
            if name == "kafka":  # a second refresh: the rates are the change between two
                expect(
                    page.locator("#kafka-api-table tr[data-api=fetch] td").nth(2)
                ).not_to_have_text("\u2013")  # the dash of "no rate yet"
            page.wait_for_timeout(300)  # let the last chart settle before the picture
            page.screenshot(path=str(OUT / f"{name}.png"))
        browser.close()


if __name__ == "__main__":
    main()
