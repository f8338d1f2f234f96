"""The ``broker`` fixture: a real ``tidewire serve`` process per test, always stopped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli._support import Broker, serving


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    """A broker on a free port with 3 partitions per auto-created topic."""
    with serving(tmp_path / "data", "--partitions", "3") as (proc, port):
        yield Broker(proc, port)
