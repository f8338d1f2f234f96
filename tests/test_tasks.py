"""cancel_and_wait stops a task without swallowing a cancellation of its caller."""

from __future__ import annotations

import asyncio

import pytest

from tidewire._tasks import cancel_and_wait


def test_the_task_is_stopped_and_its_cancellation_not_raised() -> None:
    async def main() -> None:
        inner = asyncio.create_task(asyncio.sleep(60))
        await asyncio.sleep(0)
        await cancel_and_wait(inner)
        assert inner.cancelled()

    asyncio.run(main())


def test_a_cancelled_caller_stays_cancelled() -> None:
    """The caller is cancelled while it waits for a task that is slow to stop: the caller's
    cancellation must reach it (a loop around it would otherwise never end)."""

    async def stubborn() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)  # cleans up for a while before it ends
            raise

    async def caller(inner: asyncio.Task[None]) -> None:
        while True:  # like a consumer's poll loop
            await cancel_and_wait(inner)
            await asyncio.sleep(0.001)

    async def main() -> None:
        inner = asyncio.create_task(stubborn())
        await asyncio.sleep(0)
        outer = asyncio.create_task(caller(inner))
        await asyncio.sleep(0.01)  # outer now waits for inner to stop
        outer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(outer, 5)

    asyncio.run(main())


def test_listed_errors_of_the_task_are_ignored() -> None:
    async def failing() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            raise ValueError("while stopping")

    async def main() -> None:
        inner = asyncio.create_task(failing())
        await asyncio.sleep(0)
        await cancel_and_wait(inner, ignore=(ValueError,))
        assert inner.done()

    asyncio.run(main())
