"""The dashboard's Kafka page in a real browser, fed by the broker's Kafka recorder driven
directly (as the listener drives it): the listener's address, connections, bytes, requests
by API with their rate, errors by name, versions and latency, SASL exchanges; off when there
is no listener; with authentication on, refused without describe on the cluster."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from tests.dashboard.conftest import TIMEOUT_MS, Page, open_page
from tidewire.embedded import EmbeddedBroker
from tidewire.observability.kafka_metrics import KafkaListenerStats, kafka_stats_for
from tidewire.protocol.kafka import ApiKey, ErrorCode


def _expect() -> Any:
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    return expect


def _on_loop(eb: EmbeddedBroker, act: Callable[[KafkaListenerStats], None]) -> None:
    """Drive the recorder on the broker's loop, which owns it (as the listener does)."""

    async def run() -> None:
        act(kafka_stats_for(eb.broker))

    asyncio.run_coroutine_threadsafe(run(), eb.loop).result(30)


def _workload(st: KafkaListenerStats) -> None:
    st.listening("127.0.0.1", 39092)
    st.connection_opened()
    st.connection_opened()
    st.bytes_in(2048)
    st.bytes_out(1_048_576)
    st.request(ApiKey.API_VERSIONS, 3, 0.0002, ErrorCode.UNSUPPORTED_VERSION)
    for _ in range(6):
        st.request(ApiKey.PRODUCE, 7, 0.004, 0)
    st.request(ApiKey.PRODUCE, 7, 0.004, ErrorCode.TOPIC_AUTHORIZATION_FAILED)
    st.authentication(True, "SCRAM-SHA-256")


def test_the_listener_off_then_its_figures(open_broker: EmbeddedBroker, page: Page) -> None:
    expect = _expect()
    p = page.go("kafka")
    expect(p.locator("#kafka-address")).to_contain_text("The Kafka listener is off")
    expect(p.locator("#kafka-api-table")).to_contain_text("no Kafka requests yet")
    expect(p.locator("#kafka-requests")).to_have_text("0")

    _on_loop(open_broker, _workload)
    expect(p.locator("#kafka-address")).to_have_text(
        "Listening on 127.0.0.1:39092 (Kafka wire protocol)."
    )
    expect(p.locator("#kafka-connections")).to_have_text("2")
    expect(p.locator("#kafka-requests")).to_have_text("8")
    expect(p.locator("#kafka-errors")).to_have_text("2")
    expect(p.locator("#kafka-sent-bytes")).to_contain_text("MiB")
    produce = p.locator("#kafka-api-table tr[data-api=produce]")
    expect(produce).to_have_attribute("data-requests", "7")
    expect(produce).to_contain_text("topic_authorization_failed: 1")
    expect(produce).to_contain_text("v7: 7")
    expect(produce).to_contain_text("5 ms")  # p50 and p99: the 5 ms bucket
    expect(p.locator("#kafka-api-table tr[data-api=api_versions]")).to_contain_text(
        "unsupported_version: 1"
    )
    expect(p.locator("#kafka-auth-table")).to_contain_text("SCRAM-SHA-256")

    # A burst of requests shows as a rate on the next refresh.
    _on_loop(
        open_broker,
        lambda st: [st.request(ApiKey.FETCH, 11, 0.01, 0) for _ in range(500)] and None,
    )
    p.wait_for_function(
        """() => {
          const row = document.querySelector("#kafka-api-table tr[data-api=fetch]");
          if (!row) return false;
          const rate = Number(row.children[2].textContent.replaceAll(",", ""));
          return rate > 0;
        }""",
        polling="raf",
        timeout=TIMEOUT_MS,
    )
    _on_loop(open_broker, lambda st: st.stopped())
    expect(p.locator("#kafka-address")).to_contain_text("the counts below are from when it ran")
    page.assert_clean()


def test_refused_without_describe_on_the_cluster(
    browser: Any, auth_broker: tuple[EmbeddedBroker, str]
) -> None:
    expect = _expect()
    eb, _ = auth_broker
    store = eb.broker.security

    async def make() -> str:
        await store.create_principal("viewer-k")
        _, key = await store.create_key("viewer-k")
        return str(key)

    key = asyncio.run_coroutine_threadsafe(make(), eb.loop).result(30)
    with contextlib.contextmanager(open_page)(browser, eb.http_url) as page:
        p = page.go("kafka")
        p.fill("#api-key", key)
        p.click("#login")
        expect(p.locator("#who")).to_contain_text("signed in as viewer-k")
        p.goto(f"{page.base}/dashboard#/kafka")
        expect(p.locator("#kafka-listener .msg.error")).to_contain_text(
            "The Kafka listener's figures (GET /v1/stats/kafka): refused: no permission"
        )
