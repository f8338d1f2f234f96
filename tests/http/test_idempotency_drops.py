"""10,000 publishes, each with an ``Idempotency-Key``, over connections the client cuts at
random (in the middle of the request, or after sending it whole and before the answer), each
retried until answered: every message is stored exactly once, where its answer says.

Against a real ``tidewire serve --http-port 0`` process. A control run without keys, cut the
same way, must store duplicates: the cuts do reach the broker after it stored the message,
so the check can fail.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.cli._support import popen_serve, stop

MESSAGES = 10_000
WORKERS = 16
#: Chance that an attempt's connection is cut.
DROP = 0.2
#: The whole run's limit (seconds): a hang fails instead of blocking CI.
DEADLINE_S = 120.0


@pytest.fixture
def http_url(tmp_path: Path) -> Iterator[str]:
    """A ``tidewire serve`` process with the HTTP API on a free port; its base URL."""
    proc = popen_serve(
        *("--data-dir", str(tmp_path / "d"), "--port", "0", "--http-port", "0"),
        *("--partitions", "4"),
    )
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        m = re.search(r"HTTP native listening on (http://[\d.]+:\d+)", proc.stdout.readline())
        assert m is not None
        yield m.group(1)
    finally:
        stop(proc)


class Stats:
    def __init__(self) -> None:
        self.attempts = 0
        self.cut_mid_request = 0
        self.cut_after_request = 0


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    m = re.search(rb"(?i)content-length: *(\d+)", head)
    assert m is not None, head
    return status, await reader.readexactly(int(m.group(1)))


async def publish_all(
    url: str, topic: str, n: int, *, keyed: bool, seed: int, stats: Stats
) -> dict[int, tuple[int, int]]:
    """Publish values ``m0``..``m{n-1}`` with cut connections; return value index ->
    (partition, offset) from each final answer."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)
    answers: dict[int, tuple[int, int]] = {}

    async def worker(w: int) -> None:
        rng = random.Random(seed * 1000 + w)
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        while not queue.empty():
            i = queue.get_nowait()
            body = json.dumps({"value": f"m{i}", "key": f"k{i}"}).encode()
            head = f"POST /v1/topics/{topic}/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            if keyed:
                head += f"Idempotency-Key: key-{i}\r\n"
            request = (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body
            while True:
                stats.attempts += 1
                if conn is None:
                    conn = await asyncio.open_connection(host, int(port))
                reader, writer = conn
                if rng.random() < DROP:
                    if rng.random() < 0.5:
                        writer.write(request[: rng.randrange(1, len(request))])
                        stats.cut_mid_request += 1
                    else:
                        writer.write(request)
                        stats.cut_after_request += 1
                        await asyncio.sleep(rng.uniform(0, 0.02))
                    writer.transport.abort()  # RST: the answer, if any, is lost
                    conn = None
                    continue
                writer.write(request)
                try:
                    status, payload = await _answer(reader)
                except (ConnectionError, asyncio.IncompleteReadError):
                    writer.transport.abort()
                    conn = None
                    continue
                assert status == 201, payload
                doc = json.loads(payload)
                answers[i] = (doc["partition"], doc["offset"])
                break
        if conn is not None:
            conn[1].close()

    await asyncio.wait_for(asyncio.gather(*(worker(w) for w in range(WORKERS))), DEADLINE_S)
    return answers


async def stored(url: str, topic: str) -> list[tuple[int, int, str]]:
    """Every (partition, offset, value) of ``topic``."""
    out: list[tuple[int, int, str]] = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as c:
        parts = (await c.get(f"/v1/topics/{topic}")).json()["partitions"]
        for p in range(len(parts)):
            offset = 0
            while True:
                page = (
                    await c.get(
                        f"/v1/topics/{topic}/partitions/{p}/messages",
                        params={"offset": offset, "limit": 10_000},
                    )
                ).json()
                if not page["messages"]:
                    break
                out += [(m["partition"], m["offset"], m["value"]) for m in page["messages"]]
                offset = page["next_offset"]
    return out


def test_10000_keyed_publishes_over_cut_connections_store_each_once(http_url: str) -> None:
    seed = random.randrange(1 << 30)
    stats = Stats()

    async def main() -> None:
        start = time.monotonic()
        answers = await publish_all(http_url, "keyed", MESSAGES, keyed=True, seed=seed, stats=stats)
        records = await stored(http_url, "keyed")
        values = [v for _, _, v in records]
        lost = MESSAGES - len(set(values))
        duplicates = len(values) - len(set(values))
        note = (
            f"seed={seed} attempts={stats.attempts} cut mid-request={stats.cut_mid_request} "
            f"after={stats.cut_after_request} in {time.monotonic() - start:.1f} s"
        )
        assert (lost, duplicates) == (0, 0), note
        assert stats.cut_after_request > 500, note
        where = {v: (p, o) for p, o, v in records}
        assert all(where[f"m{i}"] == answers[i] for i in range(MESSAGES)), note

        # The control: the same cuts without keys do store some messages twice.
        control = Stats()
        await publish_all(http_url, "plain", 400, keyed=False, seed=seed, stats=control)
        values = [v for _, _, v in await stored(http_url, "plain")]
        assert len(set(values)) == 400
        assert len(values) > 400, f"no duplicates without keys: {vars(control)}"

    asyncio.run(main())
