"""``subscribe``: long-poll reads from a token, resumed after the broker restarts (a lost
connection) from the tokens it holds, missing and repeating nothing; the blocking twin's
generator; and a token kept by the application to resume in a later subscription."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.client._support import PROMPT_S, addr, broker_at, in_thread, listening, run, serve
from tidewire.client import FROM_END, FROM_START, AsyncClient, Client


def test_a_subscription_survives_a_broker_restart(tmp_path: Path) -> None:
    async def main() -> None:
        async with broker_at(tmp_path) as broker, listening(broker) as server:
            port = server.port
            c = AsyncClient(addr(server), request_timeout_s=5)
            sub = c.streams.subscribe("audit", FROM_START, wait_ms=300)
            for i in range(2):
                await c.streams.send("audit", f"m{i}".encode(), persistent=True)
            got = [await asyncio.wait_for(anext(sub), PROMPT_S) for _ in range(2)]
            waiting = asyncio.ensure_future(anext(sub))  # a long-poll read in flight
            await asyncio.sleep(0.05)
        # the broker is gone: the subscription retries until it is back
        assert not waiting.done()
        async with broker_at(tmp_path) as broker, listening(broker, port=port):
            async with AsyncClient(f"127.0.0.1:{port}") as sender:
                for i in range(2, 5):
                    await sender.streams.send("audit", f"m{i}".encode(), persistent=True)
            got.append(await asyncio.wait_for(waiting, 3 * PROMPT_S))
            got += [await asyncio.wait_for(anext(sub), PROMPT_S) for _ in range(2)]
            assert [m.value for m in got] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
            # nothing repeated: nothing more comes
            extra = asyncio.ensure_future(anext(sub))
            done, _ = await asyncio.wait([extra], timeout=0.5)
            assert not done
            extra.cancel()  # ends the subscription (its read is cancelled)
            await asyncio.gather(extra, return_exceptions=True)
            await c.close()

    run(main())


def test_a_kept_token_resumes_after_the_last_message_handled(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), AsyncClient(addr(server)) as c:
            for i in range(6):
                await c.streams.send("s", f"m{i}".encode(), persistent=True)
            kept = ""
            async for m in c.streams.subscribe("s", wait_ms=100, max_messages=4):
                kept = m.token
                if m.value == b"m2":
                    break
            resumed = c.streams.subscribe({"s": kept}, wait_ms=100)
            rest = [(await asyncio.wait_for(anext(resumed), PROMPT_S)).value for _ in range(3)]
            assert rest == [b"m3", b"m4", b"m5"]

    run(main())


def test_the_blocking_subscription_is_a_generator(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server):

            def use() -> list[bytes]:
                with Client(addr(server)) as c:
                    c.streams.send("before", b"old", persistent=True)
                    sub = c.streams.subscribe({"a": FROM_START, "before": FROM_END}, wait_ms=100)
                    c.streams.send("a", b"x", persistent=True)
                    c.streams.send("a", b"y", persistent=True)
                    # the first read places "before" at its end: "old" is never read
                    got = [next(sub).value for _ in range(2)]
                    c.streams.send("before", b"new", persistent=True)
                    return [*got, next(sub).value]

            assert await in_thread(use) == [b"x", b"y", b"new"]

    run(main())
