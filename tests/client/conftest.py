"""The ``kind`` fixture: every test that takes it runs against both clients."""

from __future__ import annotations

import pytest

from tests.client._support import KINDS


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    """``"async"`` (:class:`AsyncClient`) or ``"sync"`` (its blocking twin :class:`Client`)."""
    return str(request.param)
