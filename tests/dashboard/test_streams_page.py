"""The dashboard's Streams pages in a real browser, on a broker without authentication: the
streams' figures and charts, a test message sent from the page and seen in the list, the
counters and the broker, a duplicate uuid, the list filtered by prefix and paged, a
stream's describe, and reading it by token (nothing taken); with authentication on, a
principal that may read some streams sees those and is told what is refused."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.dashboard.conftest import TIMEOUT_MS, Page, open_page
from tidewire.embedded import EmbeddedBroker
from tidewire.security.model import Acl, Operation, PatternType, ResourceType


@pytest.fixture
def api(open_broker: EmbeddedBroker) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=open_broker.http_url, timeout=30) as c:
        yield c


@pytest.fixture(autouse=True)
def _expect_timeout() -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)


def path(stream: str) -> str:
    return quote(stream, safe="")


def send(api: httpx.Client, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    r = api.post("/v1/streams/messages", json={"items": items})
    assert r.status_code == 200, r.text
    results: list[dict[str, Any]] = r.json()["results"]
    assert all(res["status"] == "stored" for res in results), results
    return results


def test_send_a_test_message_and_find_it(api: httpx.Client, page: Page) -> None:
    from playwright.sync_api import expect

    stream = f"ui {uuid.uuid4().hex[:8]}/orders.eu"  # a space and a slash: encoded in paths
    p = page.go("streams")
    expect(p.locator("#stream-streams")).to_be_visible()
    expect(p.locator("#stream-charts svg")).to_have_count(6)
    before = api.get("/v1/stats/streams").json()["sent_persistent"]

    p.fill("#stream-send-stream", stream)
    p.fill("#stream-send-value", "hello stream")
    p.fill("#stream-send-uuid", "u-1")
    p.click("#stream-send button[type=submit]")
    expect(p.locator("#stream-result .msg.success")).to_contain_text(
        f"Sent to {stream}; its token is "
    )
    expect(p.locator("#stream-send-uuid")).to_have_value("")
    info = api.get(f"/v1/streams/{path(stream)}")
    assert info.status_code == 200, info.text
    assert info.json()["persistent"] == 1
    assert info.json()["waiting"] == 1
    # The same uuid again: stored once.
    p.fill("#stream-send-stream", stream)
    p.fill("#stream-send-value", "hello again")
    p.fill("#stream-send-uuid", "u-1")
    p.click("#stream-send button[type=submit]")
    expect(p.locator("#stream-result .msg.success")).to_have_text(
        f"Not stored: uuid u-1 was sent to {stream} before."
    )
    assert api.get(f"/v1/streams/{path(stream)}").json()["persistent"] == 1
    # In memory: no token.
    p.fill("#stream-send-stream", stream)
    p.fill("#stream-send-value", "fleeting")
    p.fill("#stream-send-uuid", "")
    p.uncheck("#stream-send-persistent")
    p.click("#stream-send button[type=submit]")
    expect(p.locator("#stream-result .msg.success")).to_have_text(f"Sent to {stream} (in memory).")
    assert api.get(f"/v1/streams/{path(stream)}").json()["in_memory"] == 1
    # The counters follow (refreshed every 5 s), and the list finds the stream by prefix.
    expect(p.locator("#stream-sent-persistent")).not_to_have_text(f"{before:,}")
    p.fill("#stream-prefix", stream[:11])
    p.click("#stream-filter button[type=submit]")
    row = p.locator("#stream-table tbody tr")
    expect(row).to_have_count(1)
    expect(p.locator(f"#stream-table tr[data-stream='{stream}'][data-waiting='2']")).to_be_visible()
    row.locator("a").click()
    expect(p.locator("h1")).to_have_text(f"Stream {stream}")
    expect(p.locator("#stream-info-persistent")).to_have_text("1")
    expect(p.locator("#stream-info-in-memory")).to_have_text("1")
    page.assert_clean()


def test_list_filtered_by_prefix_and_paged(api: httpx.Client, page: Page) -> None:
    from playwright.sync_api import expect

    prefix = f"pg-{uuid.uuid4().hex[:8]}-"
    send(api, [{"stream": f"{prefix}{i:02}", "value": f"v{i}"} for i in range(60)])
    send(api, [{"stream": f"other-{prefix}", "value": "not listed"}])
    p = page.go("streams")
    p.fill("#stream-prefix", prefix)
    p.press("#stream-prefix", "Enter")
    rows = p.locator("#stream-table tbody tr")
    expect(rows).to_have_count(50)
    expect(rows.first).to_have_attribute("data-stream", f"{prefix}00")
    expect(p.locator("#stream-prev")).to_be_disabled()
    p.click("#stream-next")
    expect(rows).to_have_count(10)
    expect(rows.first).to_have_attribute("data-stream", f"{prefix}50")
    expect(rows.last).to_have_attribute("data-stream", f"{prefix}59")
    expect(p.locator("#stream-page")).to_contain_text("(the last page)")
    expect(p.locator("#stream-next")).to_be_disabled()
    p.click("#stream-prev")
    expect(rows).to_have_count(50)
    expect(rows.last).to_have_attribute("data-stream", f"{prefix}49")
    p.fill("#stream-prefix", f"{prefix}nothing")
    p.press("#stream-prefix", "Enter")
    expect(p.locator("#stream-table")).to_contain_text(f"no stream starts with {prefix}nothing")
    page.assert_clean()


def test_stream_page_reads_by_token_without_taking(api: httpx.Client, page: Page) -> None:
    from playwright.sync_api import expect

    stream = f"read-{uuid.uuid4().hex[:8]}"
    sent = send(
        api,
        [{"stream": stream, "value": f"m{i}", "persistent": True} for i in range(3)]
        + [{"stream": stream, "value": "in memory only"}],
    )
    p = page.go(f"stream/{path(stream)}")
    expect(p.locator("#stream-info-persistent")).to_have_text("3")
    expect(p.locator("#stream-info-waiting")).to_have_text("4")
    expect(p.locator("#stream-details")).to_contain_text(sent[0]["token"])

    p.click("#stream-read button[type=submit]")  # empty token: from the oldest
    rows = p.locator("#stream-read-table tbody tr")
    expect(rows).to_have_count(3)
    for i in range(3):
        expect(rows.nth(i)).to_contain_text(f"m{i}")
    expect(p.locator("#stream-read-table")).not_to_contain_text("in memory only")
    p.click("#stream-read-next")
    expect(p.locator("#stream-read-status")).to_have_text("no message from this token (yet)")
    end = p.locator("#stream-read-token").input_value()
    assert end
    # Sent from the page, read on from where the reader stopped.
    p.fill("#stream-send-value", "m3")
    p.click("#stream-send button[type=submit]")
    expect(p.locator("#stream-result .msg.success")).to_contain_text(f"Sent to {stream}")
    expect(p.locator("#stream-info-persistent")).to_have_text("4")
    p.click("#stream-read button[type=submit]")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("m3")
    # From a message's own token: that message first.
    p.fill("#stream-read-token", sent[1]["token"])
    p.click("#stream-read button[type=submit]")
    expect(rows).to_have_count(3)
    expect(rows.first).to_contain_text("m1")
    # Reading took nothing: the work queue still has them all.
    assert api.get(f"/v1/streams/{path(stream)}").json()["waiting"] == 5
    p.fill("#stream-read-token", "not-a-token")
    p.click("#stream-read button[type=submit]")
    expect(p.locator("#stream-messages .msg.error")).to_contain_text(f"Reading {stream}")


def test_a_stream_that_does_not_exist(page: Page) -> None:
    from playwright.sync_api import expect

    stream = f"missing-{uuid.uuid4().hex[:8]}"
    p = page.go(f"stream/{stream}")
    expect(p.locator("#stream-info .msg.error")).to_have_text(
        f"There is no stream {stream} now: it holds no message and nobody waits on it "
        "(a send creates it)."
    )


def _run(eb: EmbeddedBroker, coro: Any) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, eb.loop).result(30)


def test_a_reader_of_some_streams_sees_those_and_is_told_what_is_refused(
    browser: Any, auth_broker: tuple[EmbeddedBroker, str]
) -> None:
    """``chat-app`` may describe and read the streams ``chat.*`` and nothing else: the list
    shows only those, reading one works, and the figures and a send say they are refused."""
    from playwright.sync_api import expect

    eb, admin = auth_broker
    with httpx.Client(
        base_url=eb.http_url, headers={"Authorization": f"Bearer {admin}"}, timeout=30
    ) as c:
        send(
            c,
            [
                {"stream": s, "value": f"to {s}", "persistent": True}
                for s in ("chat.a", "chat.b", "billing.x")
            ],
        )
    store = eb.broker.security
    _run(eb, store.create_principal("chat-app"))
    _run(
        eb,
        store.add_acls(
            [
                Acl(
                    principal="chat-app",
                    resource_type=ResourceType.STREAM,
                    pattern="chat.",
                    pattern_type=PatternType.PREFIX,
                    operation=op,
                )
                for op in (Operation.DESCRIBE, Operation.READ)
            ]
        ),
    )
    _, key = _run(eb, store.create_key("chat-app"))
    with contextlib.contextmanager(open_page)(browser, eb.http_url) as page:
        p = page.go("streams")
        p.fill("#api-key", key)
        p.click("#login")
        expect(p.locator("#who")).to_contain_text("signed in as chat-app")
        p.goto(f"{page.base}/dashboard#/streams")
        rows = p.locator("#stream-table tbody tr")
        expect(rows).to_have_count(2)
        expect(rows.first).to_have_attribute("data-stream", "chat.a")
        expect(rows.last).to_have_attribute("data-stream", "chat.b")
        expect(p.locator("#stream-totals .msg.error")).to_contain_text(
            "The streams' figures (GET /v1/stats/streams): refused: no permission"
        )
        expect(p.locator("#stream-charts .msg.error")).to_contain_text("refused: no permission")
        p.fill("#stream-send-stream", "chat.a")
        p.fill("#stream-send-value", "not allowed")
        p.click("#stream-send button[type=submit]")
        expect(p.locator("#stream-result .msg.error")).to_contain_text(
            "Sending to chat.a: refused: no permission"
        )
        rows.first.locator("a").click()
        expect(p.locator("#stream-info-persistent")).to_have_text("1")
        p.click("#stream-read button[type=submit]")
        expect(p.locator("#stream-read-table tbody tr")).to_have_count(1)
        expect(p.locator("#stream-read-table")).to_contain_text("to chat.a")
