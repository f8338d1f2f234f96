"""Health endpoints for orchestrators: liveness, readiness, startup."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from tidewire.errors import InvalidRequestError
from tidewire.server.http.context import GatewayContext

__all__ = ["Health", "health_router"]


class Health(BaseModel):
    """A health check's answer."""

    status: str
    detail: str = ""


_UNAVAILABLE: dict[int | str, dict[str, Any]] = {
    503: {"model": Health, "description": "Not (or no longer) ready."}
}


def _running(ctx: GatewayContext) -> bool:
    try:
        _ = ctx.broker.groups  # exists from start() to close()
    except InvalidRequestError:
        return False
    return True


def health_router(ctx: GatewayContext) -> APIRouter:
    """``/healthz/live``, ``/healthz/ready``, ``/healthz/startup``."""
    router = APIRouter(prefix="/healthz", tags=["health"])

    @router.get("/live", response_model=Health)
    async def live() -> Health:
        """200 while the process answers: its event loop runs (restart it otherwise)."""
        return Health(status="ok")

    @router.get("/startup", response_model=Health, responses=_UNAVAILABLE)
    async def startup() -> Health | JSONResponse:
        """200 once the broker has opened (and recovered) its data directory."""
        if not _running(ctx):
            return JSONResponse({"status": "starting", "detail": ""}, status_code=503)
        return Health(status="ok")

    @router.get("/ready", response_model=Health, responses=_UNAVAILABLE)
    async def ready() -> Health | JSONResponse:
        """200 while the broker serves requests; 503 while it starts or drains (send traffic
        elsewhere)."""
        if ctx.closing.is_set():
            return JSONResponse({"status": "draining", "detail": "shutting down"}, 503)
        if not _running(ctx):
            return JSONResponse({"status": "starting", "detail": ""}, status_code=503)
        return Health(status="ok")

    return router
