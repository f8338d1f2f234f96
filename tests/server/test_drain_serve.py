"""SIGTERM to a real ``tidewire serve`` with the HTTP API: every listener stops accepting at
once, every wait is answered at once (a binary long-poll fetch, an HTTP long-poll read, an SSE
stream, a WebSocket stream), the stop is logged calmly, and the next start skips recovery.
A client that does not read its stream holds the drain only up to ``drain_timeout_s``, and
meanwhile nothing more is acknowledged.
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from tests.cli._support import popen_serve, stop
from tests.server._support import PROMPT_S, Client
from tidewire.client import Client as SyncClient
from tidewire.client import Message
from tidewire.errors import ConnectionLostError, ShuttingDownError, TidewireError
from tidewire.protocol.messages import FetchPartition, FetchRequest
from tidewire.storage.manager import CLEAN_SHUTDOWN_FILE

#: The grace period of the routine stop: far longer than any wait the test allows, so a wait
#: that is answered only when the grace runs out fails the test.
LONG_GRACE_S = 30
#: How long a stop with nothing slow in flight may take in all, loaded CI machine included.
STOP_BOUND_S = 10.0


class _Port:
    """What ``Client.connect`` needs of a server: its port."""

    def __init__(self, port: int) -> None:
        self.port = port


@contextmanager
def serving(
    data: Path, log: Path, *args: str, compat: bool = False
) -> Iterator[tuple[subprocess.Popen[str], int, dict[str, str]]]:
    """``tidewire serve`` with the HTTP API (``compat``: and both compatibility modes) on
    free ports, its log in ``log``: the process, the binary port and the base URL of each
    HTTP listener by name. Killed on the way out if still running."""
    http = ["--http-port", "0"]
    if compat:
        http += ["--http-msgbus-port", "0", "--http-ipubsub-port", "0"]
    with log.open("w") as err:
        proc = popen_serve(
            "--data-dir", str(data), "--port", "0", *http, *args, stderr=err.fileno()
        )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", first)
        assert m, (first, log.read_text())
        urls: dict[str, str] = {}
        for _ in range(len(http) // 2):
            line = proc.stdout.readline()
            h = re.search(r"HTTP (\w+) listening on (http://127\.0\.0\.1:\d+)", line)
            assert h, (line, log.read_text())
            urls[h.group(1)] = h.group(2)
        yield proc, int(m.group(1)), urls
    finally:
        stop(proc)


async def http_request(
    url: str, path: str, headers: str = "", *, method: str = "GET"
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Send the head of ``method path`` on a new connection; return the connection (the
    answer unread)."""
    m = re.match(r"http://([\d.]+):(\d+)", url)
    assert m
    reader, writer = await asyncio.open_connection(m.group(1), int(m.group(2)))
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}\r\n".encode())
    await writer.drain()
    return reader, writer


async def refused(host: str, port: int) -> bool:
    """Whether a new connection to ``host:port`` is refused."""
    try:
        _, writer = await asyncio.open_connection(host, port)
    except (ConnectionRefusedError, ConnectionResetError):  # reset: caught as it closed
        return True
    writer.close()
    return False


def test_sigterm_answers_every_wait_at_once_and_stops_calmly(tmp_path: Path) -> None:
    data, log = tmp_path / "data", tmp_path / "serve.log"
    with serving(data, log, "--drain-timeout-s", str(LONG_GRACE_S), compat=True) as (
        proc,
        port,
        urls,
    ):
        with SyncClient(f"127.0.0.1:{port}") as c:
            c.create_topic("t", 1)
            c.produce("t", 0, [Message(b"before")])
        url = urls["native"]

        async def main() -> float:
            async with Client.connect(_Port(port)) as poll, Client.connect(_Port(port)) as idle:  # type: ignore[arg-type]
                await idle.ping()
                fetch = poll.send(
                    FetchRequest(
                        max_wait_ms=LONG_GRACE_S * 2000,
                        partitions=[FetchPartition("t", 0, 1, 1 << 20)],
                    )
                )
                await poll.ping()  # sent after the fetch: the fetch waits by now
                # An HTTP long-poll read, an SSE stream (": connected" once it runs) and a
                # WebSocket stream ("subscribed" once it runs).
                lp_r, lp_w = await http_request(
                    url,
                    f"/v1/topics/t/partitions/0/messages?offset=1&wait_ms={LONG_GRACE_S * 2000}",
                )
                # An iPubSub long-poll receive on its own listener.
                ipubsub_r, ipubsub_w = await http_request(
                    urls["ipubsub"],
                    f"/api/v1/streams/receive?streamId=s&timeoutSeconds={LONG_GRACE_S * 2}",
                )
                sse_r, sse_w = await http_request(
                    url, "/v1/topics/t/stream", "Accept: text/event-stream\r\n"
                )
                while b": connected" not in (
                    line := await asyncio.wait_for(sse_r.readline(), PROMPT_S)
                ):
                    assert line, "the SSE stream ended before it was connected"
                ws_url = url.replace("http://", "ws://") + "/v1/topics/t/stream?from=latest"
                async with ws_connect(ws_url, open_timeout=PROMPT_S) as ws:
                    assert '"subscribed"' in str(await asyncio.wait_for(ws.recv(), PROMPT_S))
                    # A request on another connection answered: the long-poll was read first.
                    probe_r, probe_w = await http_request(url, "/healthz/live")
                    assert b" 200 " in await asyncio.wait_for(probe_r.readline(), PROMPT_S)
                    probe_w.close()

                    signalled = time.monotonic()
                    proc.send_signal(signal.SIGTERM)

                    answer = await poll.response(fetch, timeout=PROMPT_S)
                    assert answer.error is None
                    assert answer.body.partitions[0].size == 0
                    fetch_s = time.monotonic() - signalled
                    lp = await asyncio.wait_for(lp_r.read(), PROMPT_S)  # the server closes it
                    assert lp.startswith(b"HTTP/1.1 200 "), lp
                    assert b'"messages":[]' in lp
                    sse_rest = await asyncio.wait_for(sse_r.read(), PROMPT_S)  # the stream ends
                    assert b"event: error" not in sse_rest
                    with pytest.raises(ConnectionClosed) as closed:
                        await asyncio.wait_for(ws.recv(), PROMPT_S)
                    assert closed.value.rcvd is not None
                    assert closed.value.rcvd.code == 1001  # going away
                    ipubsub = await asyncio.wait_for(ipubsub_r.read(), PROMPT_S)
                    assert ipubsub.startswith(b"HTTP/1.1 "), ipubsub
                    # Every listener refuses new connections while the broker still runs.
                    assert await refused("127.0.0.1", port)
                    for base in urls.values():
                        assert await refused("127.0.0.1", int(base.rsplit(":", 1)[1]))
                    # Each binary connection is told why it is closed.
                    for conn in (poll, idle):
                        (last,) = await conn.until_closed()
                        assert isinstance(last.error, ShuttingDownError)
                lp_w.close()
                sse_w.close()
                ipubsub_w.close()
                return fetch_s

        fetch_s = asyncio.run(main())
        assert fetch_s < PROMPT_S
        assert proc.wait(STOP_BOUND_S) == 0
    text = log.read_text()
    for word in ("ERROR", "Traceback", "WARNING"):
        assert word not in text, text
    assert "draining: listeners closed" in text
    assert re.search(r"stopped cleanly in \d+\.\d+ s", text), text
    assert (data / CLEAN_SHUTDOWN_FILE).exists()
    # The next start trusts the clean stop: no recovery.
    with serving(data, log) as (proc, port, _):
        with SyncClient(f"127.0.0.1:{port}") as c:
            assert [r.value for r in c.fetch("t", 0, 0).records] == [b"before"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(STOP_BOUND_S) == 0
    assert "(after a clean shutdown)" in log.read_text()


def test_nothing_is_acknowledged_after_sigterm_while_an_upload_holds_the_drain(
    tmp_path: Path,
) -> None:
    """An HTTP client that never finishes its request body keeps the HTTP drain busy for the
    whole grace period; the binary listener must not go on accepting and acknowledging
    meanwhile, and the stop ends at the grace period with one warning."""
    grace_s = 3.0
    data, log = tmp_path / "data", tmp_path / "serve.log"
    with serving(data, log, "--drain-timeout-s", str(grace_s)) as (proc, port, urls):
        url = urls["native"]
        with SyncClient(f"127.0.0.1:{port}") as c:
            c.create_topic("t", 1)
        acked: list[float] = []
        failure: list[BaseException] = []

        def produce() -> None:
            try:
                with SyncClient(f"127.0.0.1:{port}") as client:
                    while True:
                        client.produce("t", 0, [Message(b"y")])
                        acked.append(time.monotonic())
            except TidewireError as exc:
                failure.append(exc)

        async def main() -> float:
            _, upload = await http_request(
                url,
                "/v1/topics/t/messages",
                "Content-Type: application/json\r\nContent-Length: 100\r\n",
                method="POST",
            )
            upload.write(b'{"value": "')  # and never the rest
            await upload.drain()
            # A request on another connection answered: the upload was read first.
            probe_r, probe_w = await http_request(url, "/healthz/live")
            assert b" 200 " in await asyncio.wait_for(probe_r.readline(), PROMPT_S)
            probe_w.close()
            producer = threading.Thread(target=produce)
            producer.start()
            while not acked:  # the producer is being answered
                await asyncio.sleep(0.01)
            at = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            while not await refused("127.0.0.1", port):
                assert time.monotonic() - at < PROMPT_S, "the binary listener still accepts"
                await asyncio.sleep(0.01)
            assert proc.poll() is None  # refused while the upload still holds the drain
            producer.join(STOP_BOUND_S)
            assert not producer.is_alive()
            # Held open until the broker has stopped: only the grace period ends the drain.
            await asyncio.to_thread(proc.wait, grace_s + STOP_BOUND_S)
            upload.close()
            return at

        at = asyncio.run(main())
        stopped_s = time.monotonic() - at
        assert proc.wait(STOP_BOUND_S) == 0
    assert stopped_s >= grace_s  # the upload was given its grace period
    assert len(failure) == 1
    assert isinstance(failure[0], ShuttingDownError | ConnectionLostError), failure
    late = [t - at for t in acked if t > at + 1.0]
    assert late == [], f"{len(late)} produce(s) acknowledged more than 1 s after SIGTERM"
    text = log.read_text()
    for word in ("ERROR", "Traceback"):
        assert word not in text, text
    assert "1 request(s) still running after the 3 s grace period: cancelling them" in text
    # Every acknowledged produce is there after the restart.
    with serving(data, tmp_path / "again.log") as (proc, port, _):
        with SyncClient(f"127.0.0.1:{port}") as c:
            assert c.describe_topic("t").partitions[0].log_end_offset == len(acked)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(STOP_BOUND_S) == 0
