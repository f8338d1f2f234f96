"""``/v1/admin/log-levels``: read and change the broker's log levels while it runs."""

from __future__ import annotations

import logging

from fastapi import APIRouter
from pydantic import BaseModel, Field
from starlette.responses import Response

from tidewire.errors import InvalidConfigError
from tidewire.observability import logs
from tidewire.server.http._common import json_response, responses
from tidewire.server.http.context import GatewayContext
from tidewire.server.http.errors import error_response

log = logging.getLogger("tidewire.http")

__all__ = ["LogLevel", "LogLevelChange", "LogLevels", "log_levels_router"]


class LogLevel(BaseModel):
    logger: str = Field(description="The logger's name (root: the root logger).")
    level: str = Field(description="Its own level; NOTSET: it inherits its parent's.")
    effective_level: str = Field(description="The level it logs at.")


class LogLevels(BaseModel):
    loggers: list[LogLevel] = Field(description="root, then every tidewire logger by name.")
    levels: list[str] = Field(description="The levels a logger may be set to.")


class LogLevelChange(BaseModel):
    logger: str = Field(
        max_length=200,
        description="A logger name (tidewire.storage, tidewire.server, ...); root or empty: "
        "the root logger.",
    )
    level: str = Field(
        max_length=16, description="CRITICAL, ERROR, WARNING, INFO, DEBUG or NOTSET."
    )


def _doc(name: str) -> dict[str, str]:
    lg = logging.getLogger(None if name == "root" else name)
    return {
        "logger": name,
        "level": logging.getLevelName(lg.level),
        "effective_level": logging.getLevelName(lg.getEffectiveLevel()),
    }


def log_levels_router(ctx: GatewayContext) -> APIRouter:
    """The log levels (cluster describe to read, cluster alter to change)."""
    router = APIRouter(prefix="/v1/admin/log-levels", tags=["admin"])

    @router.get("", response_model=LogLevels, responses=responses())
    async def get_log_levels() -> Response:
        """The level of the root logger and of every tidewire logger."""
        return json_response(
            {
                "loggers": [
                    {"logger": n, "level": lv, "effective_level": e} for n, lv, e in logs.levels()
                ],
                "levels": list(logs.LEVELS),
            }
        )

    @router.put("", response_model=LogLevel, responses=responses(422))
    async def put_log_level(change: LogLevelChange) -> Response:
        """Set one logger's level at once (until the broker restarts). An unknown level is
        answered 422, naming the allowed ones."""
        try:
            logs.set_level(change.logger, change.level)
        except ValueError as exc:
            return error_response(InvalidConfigError(str(exc)), 422)
        name = "root" if change.logger in ("", "root") else change.logger
        log.info("log level of %s set to %s", name, change.level.strip().upper())
        return json_response(_doc(name))

    return router
