"""The descriptor budget covers the HTTP listeners too: ``tidewire serve`` under a low limit
(``ulimit -n``) with HTTP on lowers the default caps so every listener fits, answers the
HTTP connections past its cap 503 while the binary listener keeps working (segment rolls
included), and refuses an explicit ``http_max_connections`` that cannot fit, naming the
numbers.
"""

from __future__ import annotations

import asyncio
import re
import resource
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.cli._support import STARTUP_S, stop, subprocess_env, tidewire_cmd
from tidewire.client import AsyncClient, Message
from tidewire.errors import InvalidConfigError
from tidewire.protocol.messages import TopicConfig
from tidewire.server.descriptors import ConnectionBudget, fit_listeners
from tidewire.server.tcp import RESERVED_DESCRIPTORS

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="rlimits")

#: The descriptor limit the broker runs under (soft and hard).
NOFILE = 256
#: Log files the broker keeps open under it: a quarter of the limit.
FILES = NOFILE // 4
#: Descriptors left for connections.
LEFT = NOFILE - FILES - RESERVED_DESCRIPTORS
#: The default caps, lowered in proportion for the binary listener and two HTTP ones.
NEED = 10_000 + 2 * 1_000
TCP_CAP = 10_000 * LEFT // NEED
HTTP_CAP = 1_000 * LEFT // NEED


def _low_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


def _serve(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    with (tmp_path / "serve.log").open("w") as log:  # the child keeps its own copy
        return subprocess.Popen(
            tidewire_cmd("serve", "--data-dir", str(tmp_path / "d"), "--port", "0", *args),
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            text=True,
            env=subprocess_env(),
            preexec_fn=_low_limit,  # noqa: PLW1509 - one setrlimit call, no locks
        )


def test_default_caps_are_lowered_to_fit_every_listener(tmp_path: Path) -> None:
    assert TCP_CAP + 2 * HTTP_CAP <= LEFT
    proc = _serve(tmp_path, "--http-port", "0", "--http-msgbus-port", "0")
    try:
        assert proc.stdout is not None
        tcp = re.search(r"listening on (127\.0\.0\.1:\d+)", proc.stdout.readline())
        native = re.search(
            r"HTTP native listening on http://127\.0\.0\.1:(\d+)", proc.stdout.readline()
        )
        assert tcp, (tmp_path / "serve.log").read_text()
        assert native, (tmp_path / "serve.log").read_text()
        log = (tmp_path / "serve.log").read_text()
        assert (
            f"max_connections=10,000 and http_max_connections=1,000 on 2 HTTP listeners need "
            f"12,000 descriptors, but the descriptor limit is {NOFILE}, of which {FILES} are "
            f"kept for log files (max_open_files) and {RESERVED_DESCRIPTORS} for the broker "
            f"itself: {LEFT} are left for connections; so max_connections={TCP_CAP} and "
            f"http_max_connections={HTTP_CAP} (per listener)"
        ) in log
        port = int(native.group(1))
        base = f"http://127.0.0.1:{port}"
        # Fill the native listener's cap with connections that each made a request and stay.
        clients = [httpx.Client(base_url=base, timeout=30) for _ in range(HTTP_CAP)]
        try:
            for c in clients:
                assert c.get("/healthz/live").status_code == 200
            with httpx.Client(base_url=base, timeout=30) as extra:
                over = extra.get("/healthz/live")
            assert over.status_code == 503, over.text
            assert "retry-after" in over.headers

            async def binary() -> None:
                async with AsyncClient(tcp.group(1)) as client:
                    await client.create_topic("rolls", 1, TopicConfig(segment_bytes=1024))
                    for i in range(30):  # a new segment every other batch
                        await client.produce("rolls", 0, [Message(bytes([i]) * 600)])
                    offset, values = 0, []
                    while offset < 30:
                        got = await client.fetch("rolls", 0, offset)
                        values += [r.value for r in got.records]
                        offset = got.next_offset
                    assert values == [bytes([i]) * 600 for i in range(30)]

            asyncio.run(binary())
        finally:
            for c in clients:
                c.close()
        proc.terminate()
        assert proc.wait(STARTUP_S) == 0
    finally:
        stop(proc)
    log = (tmp_path / "serve.log").read_text()
    assert "Too many open files" not in log
    assert "ERROR" not in log, log


def test_explicit_http_max_connections_that_cannot_fit_is_refused(tmp_path: Path) -> None:
    proc = _serve(tmp_path, "--http-port", "0", "--http-max-connections", "500")
    try:
        assert proc.wait(STARTUP_S) == 1
    finally:
        stop(proc)
    log = (tmp_path / "serve.log").read_text()
    assert (
        "max_connections=10,000 and http_max_connections=500 on 1 HTTP listener need 10,500 "
        f"descriptors, but the descriptor limit is {NOFILE}, of which {FILES} are kept for log "
        f"files (max_open_files) and {RESERVED_DESCRIPTORS} for the broker itself: {LEFT} are "
        "left for connections (raise the limit, ulimit -n, or lower max_connections, "
        "http_max_connections or max_open_files)"
    ) in log, log


def test_the_rule_for_explicit_and_default_caps() -> None:
    fits = fit_listeners(
        limit=1024,
        max_open_files=256,
        max_connections=500,
        http_max_connections=50,
        http_listeners=3,
    )
    assert fits == ConnectionBudget(500, 50, None)  # 650 of the 704 left
    # The binary cap set, the HTTP one default: HTTP shares what the binary one leaves.
    got = fit_listeners(
        limit=1024,
        max_open_files=256,
        max_connections=100,
        http_max_connections=1_000,
        http_listeners=3,
    )
    assert (got.max_connections, got.http_max_connections) == (100, 201)
    # The HTTP cap set, the binary one default: the binary one takes the rest.
    got = fit_listeners(
        limit=1024,
        max_open_files=256,
        max_connections=10_000,
        http_max_connections=200,
        http_listeners=3,
    )
    assert (got.max_connections, got.http_max_connections) == (104, 200)
    # Both set, too many: refused, whatever a default could give.
    with pytest.raises(InvalidConfigError, match=r"need 3,497 descriptors.* 704 are left"):
        fit_listeners(
            limit=1024,
            max_open_files=256,
            max_connections=500,
            http_max_connections=1_000 - 1,
            http_listeners=3,
        )
    # One set so high that the defaulted one would get nothing: refused too.
    with pytest.raises(InvalidConfigError, match=r"max_connections=704 and"):
        fit_listeners(
            limit=1024,
            max_open_files=256,
            max_connections=704,
            http_max_connections=1_000,
            http_listeners=1,
        )


def test_http_alone_when_no_binary_listener_runs() -> None:
    got = fit_listeners(
        limit=1024,
        max_open_files=256,
        max_connections=0,
        http_max_connections=1_000,
        http_listeners=2,
    )
    assert (got.max_connections, got.http_max_connections) == (0, 352)
    assert got.warning is not None
    assert got.warning.startswith("http_max_connections=1,000 on 2 HTTP listeners need 2,000")
    assert got.warning.endswith("; so http_max_connections=352 (per listener)")
    with pytest.raises(InvalidConfigError, match=r"^http_max_connections=400 on 2 HTTP"):
        fit_listeners(
            limit=1024,
            max_open_files=256,
            max_connections=0,
            http_max_connections=400,
            http_listeners=2,
        )
