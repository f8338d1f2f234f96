"""The ``broker`` fixture: a real ``tidewire serve`` process per test, always stopped; and
``shared_broker``, one for a module's tests that leave nothing behind."""

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


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """One broker for the tests of a module that change nothing on it (usage errors, unknown
    names): a start of ``tidewire serve`` each cost more than the test."""
    data = tmp_path_factory.mktemp("shared-broker") / "data"
    with serving(data, "--partitions", "3") as (proc, port):
        yield Broker(proc, port)
