"""Fixtures shared by the server's tests."""

from __future__ import annotations

from typing import Any

import pytest

from tidewire.server import tcp


@pytest.fixture
def tasks_of(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The API keys of the requests that were given a task (not taken by a fast path)."""
    seen: list[int] = []
    inner = tcp._ClientProtocol._handle

    async def handle(self: Any, ev: Any) -> None:
        seen.append(ev.api_key)
        await inner(self, ev)

    monkeypatch.setattr(tcp._ClientProtocol, "_handle", handle)
    return seen
