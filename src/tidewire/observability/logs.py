"""Structured logs: one JSON object per line, with the connection and request the line is
about, and log levels changed while the broker runs.

``tidewire serve --log-format json`` writes each log record as one line::

    {"ts": "2026-11-25T23:01:02.345Z", "level": "WARNING", "logger": "tidewire.server",
     "message": "...", "connection_id": "c12", "request_id": "c12-7", "api": "PRODUCE",
     "principal": "alice"}

``connection_id``, ``request_id``, ``api`` and ``principal`` are there when the line was
written while a request was handled: the binary listener binds them per request (the request
id is the connection's id and the request's correlation id), the HTTP API per request (its
``X-Request-Id``, honoured when the client sent a sane one, else generated, and echoed on the
answer). ``exc`` carries a traceback when there is one.

:func:`set_level` and :func:`levels` back ``GET/PUT /v1/admin/log-levels`` and
``tidewire log-level``.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import time
import uuid
from typing import Final, Literal, TextIO

__all__ = [
    "FORMATS",
    "LEVELS",
    "JsonFormatter",
    "bind_request",
    "configure_logging",
    "current_request_id",
    "levels",
    "new_request_id",
    "set_level",
    "valid_request_id",
]

#: The log formats of ``log_format``.
FORMATS: Final = ("text", "json")
#: The levels a logger may be set to (NOTSET: inherit its parent's).
LEVELS: Final = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG", "NOTSET")
#: The text format (``log_format = "text"``).
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: A client's X-Request-Id is kept when it is this short and plain; else one is generated
#: (a log line must not carry whatever a client wants to write into it).
_REQUEST_ID_RE: Final = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")

#: (connection_id, request_id, api, principal) of the request being handled, or None.
_REQUEST: contextvars.ContextVar[tuple[str, str, str, str] | None] = contextvars.ContextVar(
    "tidewire_log_request", default=None
)


def bind_request(connection_id: str, request_id: str, api: str, principal: str = "") -> None:
    """Name the request being handled in this task's context: every line logged from here
    on (in this task) carries them. One tuple per request, nothing per message."""
    _REQUEST.set((connection_id, request_id, api, principal))


def current_request_id() -> str | None:
    """The request id bound in this context, if any."""
    bound = _REQUEST.get()
    return bound[1] if bound is not None else None


def new_request_id() -> str:
    return uuid.uuid4().hex


def valid_request_id(value: str | None) -> bool:
    return value is not None and _REQUEST_ID_RE.fullmatch(value) is not None


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ``ts`` (UTC, ms), ``level``, ``logger``,
    ``message``, the bound request's fields when there is one, and ``exc`` (the traceback)
    when the record has exception information."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        doc: dict[str, object] = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        bound = _REQUEST.get()
        if bound is not None:
            conn, req, api, principal = bound
            if conn:
                doc["connection_id"] = conn
            doc["request_id"] = req
            if api:
                doc["api"] = api
            if principal:
                doc["principal"] = principal
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exc"] = record.exc_text
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return json.dumps(doc, ensure_ascii=False, default=str)


def check_level(level: str) -> str:
    """``level`` in capitals, if it is one of :data:`LEVELS`.

    Raises:
        ValueError: another level; the message names the allowed ones.
    """
    name = level.strip().upper()
    if name not in LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(LEVELS)}")
    return name


def check_format(fmt: str) -> Literal["text", "json"]:
    if fmt == "text":
        return "text"
    if fmt == "json":
        return "json"
    raise ValueError(f"log format {fmt!r} is not one of {', '.join(FORMATS)}")


def configure_logging(fmt: str = "text", level: str = "INFO", stream: TextIO | None = None) -> None:
    """Set up the root logger for ``tidewire serve``: one handler on ``stream`` (standard
    error by default) in ``fmt`` (``text`` or ``json``), at ``level``.

    Raises:
        ValueError: an unknown format or level.
    """
    fmt = check_format(fmt)
    name = check_level(level)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(name if name != "NOTSET" else "INFO")


def set_level(logger: str, level: str) -> str:
    """Set ``logger``'s level ("" or "root": the root logger) at run time; returns the level
    set.

    Raises:
        ValueError: an unknown level, or a logger name that is not a dotted name.
    """
    name = check_level(level)
    if logger not in ("", "root") and not re.fullmatch(r"[A-Za-z_][\w.-]{0,199}", logger):
        raise ValueError(f"logger name {logger!r} is not a dotted name of 1 to 200 characters")
    target = logging.getLogger(None if logger in ("", "root") else logger)
    target.setLevel(name)
    return name


def levels() -> list[tuple[str, str, str]]:
    """``(logger, level, effective level)`` of the root logger (``root``) and of every
    ``tidewire`` logger created so far, root first, then by name (``NOTSET``: it inherits
    its parent's level, the effective one)."""
    root = logging.getLogger()
    out = [("root", logging.getLevelName(root.level), logging.getLevelName(root.level))]
    for name in sorted(logging.root.manager.loggerDict):
        if name == "tidewire" or name.startswith("tidewire."):
            lg = logging.getLogger(name)
            out.append(
                (
                    name,
                    logging.getLevelName(lg.level),
                    logging.getLevelName(lg.getEffectiveLevel()),
                )
            )
    return out
