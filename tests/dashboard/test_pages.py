"""The dashboard in a real browser, on a broker without authentication: every page loads
without a console error, a topic is created and deleted, a group is reset (a dry run first),
the live tail shows a message published meanwhile, and selected messages export as CSV."""

from __future__ import annotations

import csv
import io
import json
import uuid
from collections.abc import Iterator
from importlib import resources
from typing import Any

import httpx
import pytest

from tests.dashboard.conftest import TIMEOUT_MS, Page
from tidewire.embedded import EmbeddedBroker
from tidewire.server.http.dashboard_routes import CONTENT_SECURITY_POLICY

TOPIC = "orders"
GROUP = "billing"


@pytest.fixture(scope="module")
def api(open_broker: EmbeddedBroker) -> Iterator[httpx.Client]:
    """A client of the broker, with a topic of 5 messages and a group with offsets."""
    with httpx.Client(base_url=open_broker.http_url, timeout=30) as c:
        assert c.post("/v1/topics", json={"name": TOPIC, "partitions": 2}).status_code == 201
        for i in range(5):
            r = c.post(
                f"/v1/topics/{TOPIC}/messages",
                json={"key": f"k{i}", "value": f"order {i}", "partition": i % 2},
            )
            assert r.status_code == 201, r.text
        r = c.post(
            f"/v1/groups/{GROUP}/commit",
            json={"offsets": [{"topic": TOPIC, "partition": 0, "offset": 2}]},
        )
        assert r.status_code == 200, r.text
        yield c


@pytest.fixture(autouse=True)
def _expect_timeout() -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)


def test_static_files_are_in_the_package_and_served_with_a_strict_policy(
    api: httpx.Client,
) -> None:
    names = {
        f.name for f in resources.files("tidewire.server.http").joinpath("dashboard").iterdir()
    }
    assert {"index.html", "app.js", "api.js", "style.css"} <= names
    page = api.get("/dashboard")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert "script-src 'self'" in CONTENT_SECURITY_POLICY
    assert "'unsafe-inline'" not in CONTENT_SECURITY_POLICY
    assert page.headers["x-frame-options"] == "DENY"
    js = api.get("/dashboard/app.js")
    assert js.status_code == 200
    assert js.headers["content-type"].startswith("text/javascript")
    assert api.get("/dashboard/missing.js").status_code == 404
    assert api.get("/dashboard/..%2Fauth.py").status_code == 404


#: Route -> a selector that appears once the page has drawn its data.
PAGES = {
    "overview": "#health",
    "topics": f"#topic-list a[href='#/topic/{TOPIC}']",
    f"topic/{TOPIC}": "#partitions",
    f"tail/{TOPIC}": "#tail-status[data-subscribed='1']",
    "groups": f"#group-list a[href='#/group/{GROUP}']",
    f"group/{GROUP}": "#offsets",
    "queues": "#queue-list table",
    "kafka": "#kafka-api-table",
    "metrics": "#charts",
    "settings": "#settings",
    "audit": "#audit table",
    "security": "#principals",
}


def test_every_page_loads_without_console_errors(api: httpx.Client, page: Page) -> None:
    from playwright.sync_api import expect

    for route, ready in PAGES.items():
        p = page.go(route)
        expect(p.locator(ready).first).to_be_visible()
        expect(p.locator("#banner")).to_be_hidden()
        assert p.locator(".msg.error").count() == 0, (
            route,
            p.locator(".msg.error").all_inner_texts(),
        )
    page.assert_clean()


def test_create_and_delete_a_topic(api: httpx.Client, page: Page) -> None:
    from playwright.sync_api import expect

    name = f"ui-{uuid.uuid4().hex[:8]}"
    p = page.go("topics")
    p.fill("#new-topic-name", name)
    p.fill("#new-topic-partitions", "3")
    p.click("#create-topic button[type=submit]")
    expect(p.locator(".msg.success")).to_have_text(f"Created topic {name}.")
    expect(p.locator(f"#topic-list a[href='#/topic/{name}']")).to_be_visible()
    assert api.get(f"/v1/topics/{name}").json()["partitions"][2]["partition"] == 2

    p.click(f"button[data-delete='{name}']")
    ok = p.locator("#confirm-ok")
    expect(ok).to_be_disabled()
    p.fill("#confirm-input", name[:-1])
    expect(ok).to_be_disabled()  # the name must be typed exactly
    p.fill("#confirm-input", name)
    ok.click()
    expect(p.locator(".msg.success")).to_have_text(f"Deleted topic {name}.")
    expect(p.locator(f"#topic-list a[href='#/topic/{name}']")).to_have_count(0)
    assert api.get(f"/v1/topics/{name}").status_code == 404
    page.assert_clean()


def test_alter_a_topic(api: httpx.Client, page: Page) -> None:
    from playwright.sync_api import expect

    topic = f"alter-{uuid.uuid4().hex[:8]}"
    assert api.post("/v1/topics", json={"name": topic, "partitions": 1}).status_code == 201
    p = page.go(f"topic/{topic}")
    p.fill("#alter-topic input[name=retention_ms]", "3600000")
    p.fill("#alter-topic input[name=partitions]", "3")
    p.click("#alter-topic button[type=submit]")
    expect(p.locator("#partitions tbody tr")).to_have_count(3)  # the page shows the new ones
    doc = api.get(f"/v1/topics/{topic}").json()
    assert doc["config"]["retention_ms"] == 3_600_000
    assert len(doc["partitions"]) == 3
    page.assert_clean()


def _committed(api: httpx.Client) -> int:
    offsets = api.get(f"/v1/groups/{GROUP}").json()["offsets"]
    return int(next(o["committed"] for o in offsets if o["partition"] == 0))


def test_reset_a_group_with_a_dry_run_first(api: httpx.Client, page: Page) -> None:
    from playwright.sync_api import expect

    assert _committed(api) == 2
    p = page.go(f"group/{GROUP}")
    p.select_option("#reset-to", "earliest")
    p.click("#reset-dry-run")
    result = p.locator("#reset-result")
    expect(result.locator(".msg.success")).to_contain_text("Dry run")
    expect(result.locator("tbody tr").first).to_contain_text("2")
    assert _committed(api) == 2  # a dry run changes nothing
    p.click("#reset-apply")
    p.click("#confirm-ok")
    expect(result.locator(".msg.success")).to_contain_text("Reset applied")
    assert _committed(api) == 0
    expect(p.locator("#reset-apply")).to_be_disabled()
    page.assert_clean()


def test_live_tail_shows_a_message_published_meanwhile(api: httpx.Client, page: Page) -> None:
    from playwright.sync_api import expect

    p = page.go(f"tail/{TOPIC}")
    expect(p.locator("#tail-status[data-subscribed='1']")).to_be_visible()
    value = f"live {uuid.uuid4().hex}"
    r = api.post(f"/v1/topics/{TOPIC}/messages", json={"key": "tail", "value": value})
    assert r.status_code == 201, r.text
    expect(p.locator("#tail-rows tr")).to_contain_text([value])
    # A filter that does not match hides what arrives next; pausing holds it.
    p.fill("#tail-value", "no such text")
    api.post(f"/v1/topics/{TOPIC}/messages", json={"value": "filtered out"})
    p.click("#tail-pause")
    api.post(f"/v1/topics/{TOPIC}/messages", json={"value": "no such text, held"})
    expect(p.locator("#tail-status")).to_contain_text("1 held while paused")
    expect(p.locator("#tail-rows tr")).to_have_count(1)
    p.click("#tail-pause")
    expect(p.locator("#tail-rows tr").first).to_contain_text("no such text, held")
    expect(p.locator("#tail-rows tr")).to_have_count(2)
    page.assert_clean()


def test_live_tail_keeps_at_most_500_rows(api: httpx.Client, page: Page) -> None:
    from playwright.sync_api import expect

    topic = f"busy-{uuid.uuid4().hex[:8]}"
    assert api.post("/v1/topics", json={"name": topic, "partitions": 1}).status_code == 201
    batch = {"messages": [{"value": f"m{i}"} for i in range(1_200)]}
    assert api.post(f"/v1/topics/{topic}/messages:batch", json=batch).status_code == 201
    p = page.go(f"tail/{topic}")
    expect(p.locator("#tail-status[data-subscribed='1']")).to_be_visible()
    p.select_option("#tail-from", "earliest")
    # 1,200 arrive (past the first credit of 1,000: the page gives credit back as it shows
    # them); the page keeps the newest 500.
    expect(p.locator("#tail-status")).to_contain_text("1200 received")
    expect(p.locator("#tail-rows tr")).to_have_count(500)
    expect(p.locator("#tail-rows tr").first).to_contain_text("m1199")
    expect(p.locator("#tail-rows tr").last).to_contain_text("m700")
    page.assert_clean()


def test_browse_search_and_export_selected_messages(api: httpx.Client, page: Page) -> None:
    from playwright.sync_api import expect

    topic = f"browse-{uuid.uuid4().hex[:8]}"
    assert api.post("/v1/topics", json={"name": topic, "partitions": 1}).status_code == 201
    for i in range(3):
        body = {"key": f"k{i}", "value": f'item {i}, "quoted"'}
        assert api.post(f"/v1/topics/{topic}/messages", json=body).status_code == 201
    p = page.go(f"topic/{topic}")
    rows = p.locator("#messages tbody tr")
    expect(rows).to_have_count(3)
    p.fill("#browse-search", "item 1")
    p.click("#browse-read")
    expect(rows).to_have_count(1)
    p.fill("#browse-search", "")
    p.click("#browse-read")
    expect(rows).to_have_count(3)
    rows.nth(1).locator("input[type=checkbox]").check()
    with p.expect_download() as got:
        p.click("#export-csv")
    parsed = list(csv.DictReader(io.StringIO(_read(got.value))))
    assert [(m["offset"], m["key"], m["value"]) for m in parsed] == [
        ("1", "k1", 'item 1, "quoted"')
    ]
    with p.expect_download() as got:
        p.click("#export-json")
    doc = json.loads(_read(got.value))
    assert [(m["offset"], m["value"]) for m in doc] == [(1, 'item 1, "quoted"')]
    # An exact key, searched by the broker; the broker's own file of the same read.
    p.fill("#browse-key", "k2")
    p.click("#browse-read")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("item 2")
    with p.expect_download() as got:
        p.click("#broker-export-csv")
    parsed = list(csv.DictReader(io.StringIO(_read(got.value))))
    assert [(m["offset"], m["key"]) for m in parsed] == [("2", "k2")]
    page.assert_clean()


def _read(download: Any) -> str:
    path = download.path()
    assert path is not None
    with open(path, encoding="utf-8") as f:
        return f.read()
