"""Cancelling a task from another one, correctly."""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["cancel_and_wait"]


async def cancel_and_wait(
    task: asyncio.Task[Any], *, ignore: tuple[type[BaseException], ...] = ()
) -> None:
    """Cancel ``task`` and wait until it has ended.

    Its CancelledError is expected and not raised; but if the caller itself is cancelled while
    it waits, that cancellation goes on (``contextlib.suppress(CancelledError)`` around the
    wait would swallow it, and a loop around the caller would never stop).

    Args:
        task: the task to stop.
        ignore: exceptions the task may end with that are not the caller's business.
    """
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
    except ignore:
        pass
