"""cancel_and_wait stops a task without swallowing a cancellation of its caller."""

from __future__ import annotations

import asyncio

import pytest

from tidewire._tasks import cancel_and_wait, wait_event


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


def test_wait_event_keeps_a_cancel_that_arrives_as_the_event_is_set() -> None:
    """A loop around wait_event, cancelled in the loop turn its event is set, stops (with
    asyncio.wait_for the cancel was lost there and a broker's background loop never ended)."""

    async def main() -> None:
        event = asyncio.Event()
        rounds = 0

        async def loop() -> None:
            nonlocal rounds
            while True:
                event.clear()
                await wait_event(event, 10)
                rounds += 1

        task = asyncio.create_task(loop())
        await asyncio.sleep(0)
        event.set()
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=5)
        assert task in done, f"still running after {rounds} rounds"
        assert task.cancelled()
        event.clear()
        assert not await wait_event(event, 0.01)  # a timeout is False
        event.set()
        assert await wait_event(event, 0.01)

    asyncio.run(main())
