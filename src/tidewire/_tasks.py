"""Cancelling a task from another one, and waiting on an event with a timeout, correctly."""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["cancel_and_wait", "wait_event"]


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


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until ``event`` is set or ``timeout_s`` has passed; whether it was set.

    Not ``asyncio.wait_for(event.wait(), ...)``: in Python 3.11 that returns normally when a
    cancellation arrives in the same loop turn as the event is set, so the cancellation is
    lost and a loop around it, cancelled to stop, runs on forever.
    """
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True
