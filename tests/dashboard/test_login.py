"""The dashboard with authentication on: the sign-in page, a session from an API key, and an
action a viewer (describe and read on one topic only) is refused, shown as a message."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.dashboard.conftest import TIMEOUT_MS, Page, open_page
from tidewire.embedded import EmbeddedBroker
from tidewire.security.model import Acl, Operation, ResourceType

TOPIC = "payments"


@pytest.fixture(autouse=True)
def _expect_timeout() -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)


def _run(eb: EmbeddedBroker, coro: Any) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, eb.loop).result(30)


@pytest.fixture(scope="module")
def viewer_key(auth_broker: tuple[EmbeddedBroker, str]) -> str:
    """The key of ``viewer``, who may describe and read TOPIC and nothing else."""
    eb, admin = auth_broker
    with httpx.Client(
        base_url=eb.http_url, headers={"Authorization": f"Bearer {admin}"}, timeout=30
    ) as c:
        assert c.post("/v1/topics", json={"name": TOPIC, "partitions": 1}).status_code == 201
        assert c.post(f"/v1/topics/{TOPIC}/messages", json={"value": "paid"}).status_code == 201
    store = eb.broker.security
    _run(eb, store.create_principal("viewer"))
    _run(
        eb,
        store.add_acls(
            [
                Acl(
                    principal="viewer",
                    resource_type=ResourceType.TOPIC,
                    pattern=TOPIC,
                    operation=op,
                )
                for op in (Operation.DESCRIBE, Operation.READ)
            ]
        ),
    )
    _, secret = _run(eb, store.create_key("viewer"))
    assert isinstance(secret, str)
    return secret


@pytest.fixture
def auth_page(browser: Any, auth_broker: tuple[EmbeddedBroker, str]) -> Iterator[Page]:
    yield from open_page(browser, auth_broker[0].http_url)


def _sign_in(page: Page, key: str) -> Any:
    from playwright.sync_api import expect

    p = page.go("overview")
    expect(p.locator("#api-key")).to_be_visible()  # sent to sign in first
    p.fill("#api-key", key)
    p.click("#login")
    expect(p.locator("#who")).to_contain_text("signed in as")
    return p


def test_sign_in_with_an_api_key_and_out(
    auth_broker: tuple[EmbeddedBroker, str], auth_page: Page
) -> None:
    from playwright.sync_api import expect

    _, admin = auth_broker
    p = auth_page.go("topics")
    expect(p.locator("#api-key")).to_be_visible()
    p.fill("#api-key", "twk_000000000000_wrong")
    p.click("#login")
    expect(p.locator(".msg.error")).to_contain_text("Sign-in")
    p.fill("#api-key", admin)
    p.click("#login")
    expect(p.locator("#who")).to_contain_text("signed in as admin")
    expect(p.locator("#health")).to_be_visible()
    cookie = next(c for c in p.context.cookies() if c["name"] == "tidewire_session")
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Strict"
    assert admin not in p.content()  # the key is not kept on the page
    p.click("#logout")
    expect(p.locator("#api-key")).to_be_visible()


def test_a_viewer_sees_less_and_is_told_what_is_refused(
    auth_broker: tuple[EmbeddedBroker, str], viewer_key: str, auth_page: Page
) -> None:
    from playwright.sync_api import expect

    p = _sign_in(auth_page, viewer_key)
    expect(p.locator("#who")).to_contain_text("signed in as viewer")
    # What the session's permissions rule out is not offered...
    expect(p.locator("#nav-topics")).to_be_visible()
    expect(p.locator("#nav-audit")).to_have_count(0)
    expect(p.locator("#nav-security")).to_have_count(0)
    p.goto(f"{auth_page.base}/dashboard#/topics")
    expect(p.locator(f"#topic-list a[href='#/topic/{TOPIC}']")).to_be_visible()
    expect(p.locator("#create-topic")).to_have_count(0)
    expect(p.locator(f"button[data-delete='{TOPIC}']")).to_have_count(0)
    p.goto(f"{auth_page.base}/dashboard#/topic/{TOPIC}")
    expect(p.locator("#messages tbody tr")).to_have_count(1)  # reading is allowed
    expect(p.locator("#produce")).to_have_count(0)
    # The live tail's WebSocket is authenticated by the session cookie as well.
    p.goto(f"{auth_page.base}/dashboard#/tail/{TOPIC}")
    expect(p.locator("#tail-status[data-subscribed='1']")).to_be_visible()
    eb, admin = auth_broker
    with httpx.Client(base_url=eb.http_url, timeout=30) as c:
        r = c.post(
            f"/v1/topics/{TOPIC}/messages",
            json={"value": "seen by the viewer"},
            headers={"Authorization": f"Bearer {admin}"},
        )
        assert r.status_code == 201, r.text
    expect(p.locator("#tail-rows tr").first).to_contain_text("seen by the viewer")
    # ...and what the broker refuses anyway is said, not swallowed.
    p.goto(f"{auth_page.base}/dashboard#/audit")
    expect(p.locator("#audit .msg.error")).to_contain_text(
        "Reading the audit log: refused: no permission"
    )
    p.goto(f"{auth_page.base}/dashboard#/security")
    expect(p.locator("#banner")).to_contain_text("GET /v1/principals: refused, no permission")
