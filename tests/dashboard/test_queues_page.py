"""The dashboard's Queues pages in a real browser, on a broker without authentication: a
queue declared from the page, a message published from it and seen in the counts and the
browser, dead letters replayed to the queue they died in, and a queue purged."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.dashboard.conftest import TIMEOUT_MS, Page, open_page
from tidewire.embedded import EmbeddedBroker


@pytest.fixture
def api(open_broker: EmbeddedBroker) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=open_broker.http_url, timeout=30) as c:
        yield c


@pytest.fixture(autouse=True)
def _expect_timeout() -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)


def eventually(check: Callable[[], bool], what: str) -> None:
    """Wait until ``check()`` holds (dead letters move after the reject is answered)."""
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while not check():
        assert time.monotonic() < deadline, f"not in time: {what}"
        time.sleep(0.02)


def test_declare_publish_browse_and_purge(api: httpx.Client, page: Page) -> None:
    from playwright.sync_api import expect

    name = f"uiq-{uuid.uuid4().hex[:8]}"
    p = page.go("queues")
    p.fill("#new-queue-name", name)
    p.click("#declare-queue button[type=submit]")
    expect(p.locator(".msg.success")).to_have_text(f"Declared queue {name}.")
    expect(p.locator(f"#queue-list a[href='#/queue/{name}']")).to_be_visible()
    doc = api.get(f"/v1/queues/{name}").json()
    assert doc["durable"] is True
    assert doc["dead_letter_exchange"] is None
    expect(p.locator("#exchange-list")).to_contain_text("amq.default")

    p.click(f"#queue-list a[href='#/queue/{name}']")
    for value in ("first job", "second job"):
        p.fill("#queue-publish-value", value)
        p.click("#queue-publish button[type=submit]")
        expect(p.locator("#queue-result .msg.success")).to_have_text(f"Published to {name}.")
    expect(p.locator("#queue-ready")).to_have_text("2")
    expect(p.locator("#queue-published")).to_have_text("2")
    rows = p.locator("#dlq-table tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.first).to_contain_text("first job")
    assert api.get(f"/v1/queues/{name}").json()["ready"] == 2  # browsing delivers nothing

    p.click("#dlq-purge")
    ok = p.locator("#confirm-ok")
    expect(ok).to_be_disabled()
    p.fill("#confirm-input", name)
    ok.click()
    expect(p.locator("#queue-result .msg.success")).to_have_text(
        f"Purged 2 message(s) from {name}."
    )
    expect(p.locator("#queue-ready")).to_have_text("0")
    expect(p.locator("#dlq-table")).to_contain_text("no ready messages")
    assert api.get(f"/v1/queues/{name}").json()["ready"] == 0

    p = page.go("queues")
    expect(p.locator(f"#queue-list tr[data-queue='{name}'][data-ready='0']")).to_be_visible()
    page.assert_clean()


def test_dead_letters_are_replayed_from_the_page(api: httpx.Client, page: Page) -> None:
    from playwright.sync_api import expect

    suffix = uuid.uuid4().hex[:8]
    work, dead = f"work-{suffix}", f"dead-{suffix}"
    assert api.put(f"/v1/queues/{dead}", json={}).status_code == 201
    body = {"dead_letter_exchange": "amq.default", "dead_letter_routing_key": dead}
    assert api.put(f"/v1/queues/{work}", json=body).status_code == 201
    r = api.post(
        "/v1/exchanges/amq.default/publish",
        json={"routing_key": work, "messages": [{"value": "bad 1"}, {"value": "bad 2"}]},
    )
    assert r.status_code == 200, r.text
    got = api.post(f"/v1/queues/{work}/get", json={"max_messages": 2}).json()["messages"]
    r = api.post(f"/v1/queues/{work}/reject", json={"tags": [m["tag"] for m in got]})
    assert r.status_code == 200, r.text
    eventually(lambda: api.get(f"/v1/queues/{dead}").json()["ready"] == 2, "dead-lettered")

    p = page.go(f"queue/{dead}")
    rows = p.locator("#dlq-table tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.first).to_contain_text(work)
    expect(rows.first).to_contain_text("rejected")
    rows.first.locator("input[type=checkbox]").check()
    p.click("#dlq-replay-selected")
    expect(p.locator("#queue-result .msg.success")).to_have_text(
        "Replayed 1 message(s) (the selected ones)."
    )
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("bad 2")
    assert api.get(f"/v1/queues/{work}").json()["ready"] == 1
    p.click("#dlq-replay-all")
    p.click("#confirm-ok")
    expect(p.locator("#queue-result .msg.success")).to_have_text("Replayed 1 message(s) (all).")
    expect(p.locator("#queue-ready")).to_have_text("0")
    assert api.get(f"/v1/queues/{work}").json()["ready"] == 2
    page.assert_clean()


def test_signed_in_the_page_acts_through_the_session(
    browser: Any, auth_broker: tuple[EmbeddedBroker, str]
) -> None:
    """With authentication on, the page's changes go with the session cookie and its CSRF
    token (a request without the token is refused: the page's succeed)."""
    from playwright.sync_api import expect

    eb, admin = auth_broker
    name = f"authq-{uuid.uuid4().hex[:8]}"
    for page in open_page(browser, eb.http_url):
        p = page.go("overview")
        p.fill("#api-key", admin)
        p.click("#login")
        expect(p.locator("#who")).to_contain_text("signed in as")
        page.errors.clear()  # the 401 of the session asked for before signing in
        p = page.go("queues")
        p.fill("#new-queue-name", name)
        p.click("#declare-queue button[type=submit]")
        expect(p.locator(".msg.success")).to_have_text(f"Declared queue {name}.")
        p = page.go(f"queue/{name}")
        p.fill("#queue-publish-value", "signed")
        p.click("#queue-publish button[type=submit]")
        expect(p.locator("#queue-ready")).to_have_text("1")
        p.click("#dlq-purge")
        p.fill("#confirm-input", name)
        p.click("#confirm-ok")
        expect(p.locator("#queue-result .msg.success")).to_have_text(
            f"Purged 1 message(s) from {name}."
        )
        # The same purge without the CSRF token, with the page's cookie: refused.
        cookies = {c["name"]: c["value"] for c in p.context.cookies()}
        with httpx.Client(base_url=eb.http_url, cookies=cookies, timeout=30) as c:
            r = c.post(f"/v1/queues/{name}/dlq/purge")
            assert r.status_code == 403, r.text
        page.assert_clean()
