"""Fixtures every test gets."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _serve_logging_undone() -> Iterator[None]:
    """Undo what ``tidewire serve`` run in-process (through the CLI runner) did to the root
    logger: it sets up logging for a whole process, and its handler would outlive the test,
    writing to the runner's closed stream (a "Logging error" in every later test's output).
    pytest's own capture handlers (subclasses) are left to pytest."""
    root = logging.getLogger()
    before, level = set(root.handlers), root.level
    yield
    for h in list(root.handlers):
        if type(h) is logging.StreamHandler and h not in before:
            root.removeHandler(h)
    root.setLevel(level)
