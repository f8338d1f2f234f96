"""``tidewire serve --kafka-port``: a real process serving Kafka's protocol, the address it
prints, and SIGTERM draining a Kafka connection (its long-poll answered, then closed)."""

from __future__ import annotations

import asyncio
import re
import signal
from pathlib import Path

from tests.cli._support import STARTUP_S, popen_serve, stop
from tests.kafka._support import Wire, batch, fetch_body, produce_body
from tidewire.protocol.kafka import ApiKey


def test_serve_with_a_kafka_port_and_sigterm(tmp_path: Path) -> None:
    proc = popen_serve(
        "--data-dir", str(tmp_path / "d"), "--port", "0", "--kafka-port", "0", "--partitions", "1"
    )
    try:
        assert proc.stdout is not None
        assert "listening on" in proc.stdout.readline()
        line = proc.stdout.readline()
        m = re.search(
            r"Kafka listening on 127\.0\.0\.1:(\d+), advertised as 127\.0\.0\.1:(\d+)", line
        )
        assert m is not None, line
        assert m.group(1) == m.group(2)
        port = int(m.group(1))

        async def talk() -> None:
            w = await Wire.connect(port)
            got = await w.call(ApiKey.PRODUCE, 7, produce_body("events", 0, batch([b"a"])))
            assert got["responses"][0]["partition_responses"][0]["error_code"] == 0
            meta = await w.call(ApiKey.METADATA, 8, {"topics": None})
            assert meta["brokers"][0]["port"] == port
            await w.send(ApiKey.FETCH, 11, fetch_body("events", 0, 1, max_wait_ms=60_000))
            # The fetch's bytes reached the broker before this connection was even opened:
            # the broker's loop has read it and the fetch waits by the time the answer of a
            # round trip on a connection made after it comes back.
            other = await Wire.connect(port)
            assert (await other.call(ApiKey.API_VERSIONS, 2, {}))["error_code"] == 0
            await other.close()
            proc.send_signal(signal.SIGTERM)
            _, fetched = await w.receive(ApiKey.FETCH, 11)  # answered at once, not in 60 s
            assert fetched["responses"][0]["partitions"][0]["error_code"] == 0
            assert await w.closed()
            await w.close()

        asyncio.run(asyncio.wait_for(talk(), STARTUP_S))
        assert proc.wait(timeout=STARTUP_S) == 0
    finally:
        stop(proc)
    assert (tmp_path / "d" / ".clean-shutdown").exists()


def test_a_kafka_listener_on_the_network_needs_authentication(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tidewire.cli import app

    args = ["serve", "--data-dir", str(tmp_path), "--port", "0", "--kafka-port", "0"]
    result = CliRunner().invoke(app, [*args, "--kafka-host", "0.0.0.0"])
    assert result.exit_code != 0
    assert "0.0.0.0" in result.output
    assert "authentication" in result.output
