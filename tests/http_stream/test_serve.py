"""``tidewire serve`` with every HTTP listener on a free port: the native API's stream and both
compatibility modes answer, each on its own port, in one broker process."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import httpx
from websockets.sync.client import connect

from tests.cli._support import STARTUP_S, popen_serve, stop


def test_serve_with_the_stream_and_both_compatibility_modes(tmp_path: Path) -> None:
    args = ["--data-dir", str(tmp_path), "--port", "0", "--http-port", "0"]
    args += ["--http-msgbus-port", "0", "--http-ipubsub-port", "0"]
    proc = popen_serve(*args)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # the TCP listener
        urls = {}
        for _ in range(3):
            line = proc.stdout.readline()
            m = re.search(r"HTTP (\w+) listening on (http://127\.0\.0\.1:\d+)", line)
            assert m, line
            urls[m.group(1)] = m.group(2)
        assert set(urls) == {"native", "msgbus", "ipubsub"}
        assert len(set(urls.values())) == 3
        # msgbus: publish; the native stream sees it in the topic msgbus.hello.
        assert httpx.put(f"{urls['msgbus']}/hello", content=b"hi").status_code == 202
        ws_url = urls["native"].replace("http://", "ws://")
        with connect(f"{ws_url}/v1/topics/msgbus.hello/stream?from=earliest") as ws:
            assert json.loads(ws.recv(timeout=STARTUP_S))["type"] == "subscribed"
            assert json.loads(ws.recv(timeout=STARTUP_S))["value"] == "hi"
        # iPubSub: send, receive.
        base = f"{urls['ipubsub']}/api/v1/streams"
        body = {"streamId": "s", "messageUuid": "u", "message": {"n": 1}}
        assert httpx.post(f"{base}/send", json=body).status_code == 200
        r = httpx.get(f"{base}/receive", params={"streamId": "s", "timeoutSeconds": 5})
        assert r.json()["message"] == {"n": 1}
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(STARTUP_S) == 0
    finally:
        stop(proc)
