"""Health endpoints for orchestrators: liveness, readiness, startup."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from tidewire.errors import InvalidRequestError
from tidewire.server.http.context import GatewayContext

__all__ = ["Health", "StorageHealth", "health_router"]


class Health(BaseModel):
    """A health check's answer."""

    status: str
    detail: str = ""


#: Problems one /healthz/storage answer lists (``problems_total`` counts them all).
MAX_PROBLEMS = 100


class StorageProblemDoc(BaseModel):
    """A partition that does not serve all it holds (see ``Broker.storage_problems``)."""

    topic: str
    partition: int
    kind: str = Field(description="damaged, quarantined or offline")
    start: int = Field(description="First offset of the range (-1 for offline).")
    end: int = Field(description="First offset after it (-1 for offline).")
    size_bytes: int
    file: str = Field(description="The segment file (damaged) or the quarantine file.")
    reason: str


class StorageHealth(BaseModel):
    """/healthz/storage's answer."""

    status: str = Field(description="ok, or degraded when there are problems")
    problems: list[StorageProblemDoc]
    problems_total: int


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
    """``/healthz/live``, ``/healthz/ready``, ``/healthz/startup``, ``/healthz/storage``."""
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

    @router.get("/storage", response_model=StorageHealth)
    async def storage() -> StorageHealth:
        """What the broker's storage does not serve (always 200 while it runs): damaged
        ranges of a log (refused to readers), quarantined ranges (read past as gaps),
        offline partitions. ``status`` is ``ok`` when there are none, else ``degraded``."""
        problems = ctx.broker.storage_problems() if _running(ctx) else []
        return StorageHealth(
            status="degraded" if problems else "ok",
            problems=[StorageProblemDoc(**asdict(p)) for p in problems[:MAX_PROBLEMS]],
            problems_total=len(problems),
        )

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
