"""``tidewire log-level``: read or change the broker's log levels while it runs, through the
HTTP API's ``/v1/admin/log-levels`` (cluster describe to read, cluster alter to change)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Annotated, Any

import typer

from tidewire.observability.logs import LEVELS

from ._common import EXIT_ERROR, ApiKeyOption, JsonOption, echo_json, fail

__all__ = ["DEFAULT_HTTP_URL", "log_level"]

#: The broker's HTTP API unless --http-url or TIDEWIRE_HTTP_URL says otherwise.
DEFAULT_HTTP_URL = "http://127.0.0.1:8080"
#: How long one request may take (s).
_TIMEOUT_S = 30.0
_PATH = "/v1/admin/log-levels"


def log_level(
    logger: Annotated[
        str | None,
        typer.Argument(
            help="A logger (tidewire.storage, tidewire.server, root, ...); none: list them all."
        ),
    ] = None,
    level: Annotated[
        str | None,
        typer.Argument(help=f"Set it to this level: {', '.join(LEVELS)}; none: show it."),
    ] = None,
    url: Annotated[
        str,
        typer.Option(
            "--http-url",
            "--url",
            envvar="TIDEWIRE_HTTP_URL",
            help="The broker's HTTP API (its http_port must be on).",
        ),
    ] = DEFAULT_HTTP_URL,
    api_key: ApiKeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show the log levels of the broker, or one logger's, or set one logger's level (it
    applies at once, until the broker restarts).

    Exit code 0: done; 1: the broker refused (the reason is printed) or cannot be reached.
    """
    base = url.rstrip("/")
    if level is not None:
        assert logger is not None
        status, doc = _request("PUT", base + _PATH, api_key, {"logger": logger, "level": level})
        _check(status, doc)
        if as_json:
            echo_json(doc)
        else:
            typer.echo(f"{doc['logger']}: {doc['level']} (logs at {doc['effective_level']})")
        return
    status, doc = _request("GET", base + _PATH, api_key)
    _check(status, doc)
    rows = doc["loggers"]
    if logger is not None:
        name = "root" if logger in ("", "root") else logger
        rows = [r for r in rows if r["logger"] == name]
        if not rows:
            # A logger not created yet inherits: say what it would log at.
            rows = [{"logger": name, "level": "NOTSET", "effective_level": _inherited(doc, name)}]
    if as_json:
        echo_json({"loggers": rows, "levels": doc["levels"]})
        return
    width = max(len(r["logger"]) for r in rows)
    for r in rows:
        typer.echo(f"{r['logger']:<{width}}  {r['level']:<8}  (logs at {r['effective_level']})")


def _inherited(doc: dict[str, Any], name: str) -> str:
    levels = {r["logger"]: r for r in doc["loggers"]}
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        parent = levels.get(".".join(parts[:i]))
        if parent is not None:
            return str(parent["effective_level"])
    return str(levels["root"]["effective_level"])


def _check(status: int, doc: dict[str, Any]) -> None:
    if status == 200:
        return
    err = doc.get("error") if isinstance(doc, dict) else None
    message = err.get("message") if isinstance(err, dict) else None
    fail(f"HTTP {status}: {message or doc}", EXIT_ERROR)


def _request(
    method: str, url: str, api_key: str | None, body: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=_TIMEOUT_S) as resp:
            status, raw = int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
        exc.close()  # its socket
    except (urllib.error.URLError, OSError) as exc:
        fail(f"cannot reach {url}: {getattr(exc, 'reason', exc)}")
    try:
        doc = json.loads(raw)
    except ValueError:
        fail(f"HTTP {status} from {url}: not JSON: {raw[:200]!r}")
    return status, doc if isinstance(doc, dict) else {"value": doc}
