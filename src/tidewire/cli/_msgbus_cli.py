"""``tidewire pub | sub | pull``: msgbus' command-line client, spelled ``tidewire``.

msgbus' ``msgbus pub TOPIC MESSAGE``, ``msgbus sub TOPIC`` and ``msgbus pull TOPIC`` talk to a
msgbus server over its HTTP API (``--uri``, ``http://localhost:8000`` by default); these do
the same against tidewire's msgbus compatibility listener (``tidewire serve
--http-msgbus-port 8000``, docs/http-compat.md), so a msgbus user swaps the command's name
and nothing else:

- ``pub TOPIC [MESSAGE]``: ``PUT URI/TOPIC`` with the message (``-`` or none: standard input);
  prints nothing when it is published.
- ``sub TOPIC``: a WebSocket on ``URI/TOPIC``; prints each message published from then on,
  one line each, until Ctrl-C.
- ``pull TOPIC``: ``GET URI/TOPIC`` until the queue is empty (404), printing each message
  taken.

A message prints as msgbus' client logs it: ``2017/08/07 01:11:22 [msgbus] received
message: id=0 topic=foo payload=hi`` (local time; the payload as UTF-8 text), on standard
output. Errors print one line on stderr; exit codes as every client command: 0, 1 (the
server refused or cannot be reached), 2 (usage), 130 (Ctrl-C).
"""

from __future__ import annotations

import base64
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Annotated, Any

import typer

from ._common import EXIT_INTERRUPTED, EXIT_USAGE, fail

__all__ = ["DEFAULT_URI", "pub", "pull", "register", "sub"]

#: msgbus' default server address (its ``--uri``).
DEFAULT_URI = "http://localhost:8000"
#: How long one HTTP request or the WebSocket handshake may take (s).
_TIMEOUT_S = 30.0
#: The largest message accepted from the server on a subscription (bytes): a msgbus message
#: is at most ``http_msgbus_max_payload_bytes`` (8 KiB by default) in base64 within its
#: JSON; 16 MiB leaves room for any configured limit a subscriber would want.
_MAX_FRAME_BYTES = 16 * 1024 * 1024

UriOption = Annotated[
    str,
    typer.Option(
        "--uri", "-u", help="The msgbus API: tidewire serve --http-msgbus-port's address."
    ),
]
TopicArg = Annotated[str, typer.Argument(help="The msgbus topic (queue).", show_default=False)]


def _topic_url(uri: str, topic: str) -> str:
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        fail(f"--uri: {uri!r} must be an http:// or https:// address", EXIT_USAGE)
    if not topic:
        fail("the topic must not be empty", EXIT_USAGE)
    return uri.rstrip("/") + "/" + urllib.parse.quote(topic, safe="")


def _line(doc: dict[str, Any]) -> str:
    """A message as msgbus' client prints it."""
    stamp = time.strftime("%Y/%m/%d %H:%M:%S")
    payload = base64.b64decode(doc.get("payload") or "").decode("utf-8", "replace")
    # Go's log.Printf, which msgbus prints with, ends a line that ends with a newline itself
    # (echo's message) without adding another.
    payload = payload.removesuffix("\n")
    topic = doc.get("topic") or {}
    return (
        f"{stamp} [msgbus] received message: id={doc.get('id')} "
        f"topic={topic.get('name', '')} payload={payload}"
    )


def _request(method: str, url: str, data: bytes | None = None) -> tuple[int, bytes]:
    """One HTTP request: (status, body); a refused connection exits 1."""
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/octet-stream")
    try:
        with urllib.request.urlopen(req, timeout=_TIMEOUT_S) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        with exc:  # its socket, closed now rather than whenever it is collected
            return exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        fail(f"cannot reach {url}: {reason}")


def pub(
    topic: TopicArg,
    message: Annotated[
        str, typer.Argument(help="The message; '-' or none: read it from standard input.")
    ] = "-",
    uri: UriOption = DEFAULT_URI,
) -> None:
    """Publish a message to a msgbus topic (msgbus pub TOPIC MESSAGE)."""
    url = _topic_url(uri, topic)
    data = sys.stdin.buffer.read() if message == "-" else message.encode()
    try:
        status, body = _request("PUT", url, data)
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_INTERRUPTED) from None
    if not 200 <= status < 300:
        fail(f"{status}: {body.decode('utf-8', 'replace').strip()}")


def pull(topic: TopicArg, uri: UriOption = DEFAULT_URI) -> None:
    """Take every message queued on a msgbus topic, oldest first, and print each
    (msgbus pull TOPIC)."""
    url = _topic_url(uri, topic)
    try:
        while True:
            status, body = _request("GET", url)
            if status == 404:  # no (more) messages: msgbus' end of the queue
                return
            if status != 200:
                fail(f"{status}: {body.decode('utf-8', 'replace').strip()}")
            typer.echo(_line(json.loads(body)))
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_INTERRUPTED) from None


def sub(topic: TopicArg, uri: UriOption = DEFAULT_URI) -> None:
    """Subscribe to a msgbus topic and print each message published from now on, until
    Ctrl-C (msgbus sub TOPIC). Once subscribed, a line on stderr says so."""
    # Imported here: only this command needs a WebSocket client.
    from websockets.exceptions import ConnectionClosed, WebSocketException  # noqa: PLC0415
    from websockets.sync.client import connect  # noqa: PLC0415

    url = _topic_url(uri, topic)
    ws_url = "ws" + url[len("http") :]  # http -> ws, https -> wss
    try:
        with connect(
            ws_url, open_timeout=_TIMEOUT_S, max_size=_MAX_FRAME_BYTES, close_timeout=1.0
        ) as ws:
            typer.echo(f"subscribed to {topic} at {uri}", err=True)
            while True:
                frame = ws.recv()
                text = frame if isinstance(frame, str) else frame.decode("utf-8", "replace")
                typer.echo(_line(json.loads(text)))
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except ConnectionClosed as exc:
        reason = exc.rcvd.reason if exc.rcvd is not None and exc.rcvd.reason else "closed"
        fail(f"the subscription to {topic} ended: {reason}")
    except (WebSocketException, OSError, TimeoutError) as exc:
        fail(f"cannot subscribe at {ws_url}: {exc}")


def register(app: typer.Typer) -> None:
    """Add ``pub``, ``sub`` and ``pull`` to the ``tidewire`` command."""
    for command in (pub, sub, pull):
        app.command()(command)
