"""Health endpoints for orchestrators: liveness, readiness, startup."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from tidewire.errors import InvalidRequestError
from tidewire.server.http.context import GatewayContext
from tidewire.server.runtime import runtime_of

__all__ = ["Health", "ListenersHealth", "RecoveryHealth", "StorageHealth", "health_router"]


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


class ListenerDoc(BaseModel):
    name: str = Field(description="binary (the TCP protocol), native, msgbus or ipubsub.")
    host: str
    port: int
    tls: bool


class ListenersHealth(BaseModel):
    """/healthz/listeners' answer."""

    status: str = Field(
        description="ok while serving, draining while shutting down, unknown when the broker "
        "recorded no listeners (started neither by tidewire serve nor embedded)"
    )
    listeners: list[ListenerDoc]


class RecoveryHealth(BaseModel):
    """/healthz/recovery's answer: how the last start opened the data directory."""

    status: str = Field(description="ok, or degraded when partitions are offline or damaged")
    clean_shutdown: bool = Field(
        description="Whether the last stop was clean (the logs' indexes were trusted); false: "
        "the tails were scanned and repaired."
    )
    last_start: str = Field(
        description="new (an empty data directory: nothing to recover), clean (after a clean "
        "stop) or unclean (the logs' tails were scanned and repaired)."
    )
    open_seconds: float = Field(description="How long opening the data directory took, s.")
    partitions: int = Field(description="Partitions opened (internal topics included).")
    offline: int = Field(description="Partitions that could not be opened.")
    damaged_ranges: int = Field(description="Damaged or quarantined ranges found.")


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
    """``/healthz/live``, ``/healthz/ready``, ``/healthz/startup``, ``/healthz/storage``,
    ``/healthz/listeners``, ``/healthz/recovery``."""
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

    @router.get("/listeners", response_model=ListenersHealth)
    async def listeners() -> ListenersHealth:
        """The listeners serving the broker (the binary protocol, the HTTP API and its
        compatibility modes) with their addresses, bound ports and TLS."""
        got = runtime_of(ctx.broker).listeners
        status = "draining" if ctx.closing.is_set() else ("ok" if got else "unknown")
        return ListenersHealth(status=status, listeners=[ListenerDoc(**asdict(x)) for x in got])

    @router.get("/recovery", response_model=RecoveryHealth, responses=_UNAVAILABLE)
    async def recovery() -> RecoveryHealth | JSONResponse:
        """How the last start opened the data directory: after a clean stop or not, and
        the partitions opened, offline and with damaged ranges (503 while starting)."""
        if not _running(ctx):
            return JSONResponse({"status": "starting", "detail": ""}, status_code=503)
        logs = ctx.broker.logs
        damaged = sum(len(plog.damage) for plog in logs.logs.values())
        return RecoveryHealth(
            status="degraded" if damaged or logs.offline else "ok",
            clean_shutdown=logs.was_clean,
            last_start=logs.last_start,
            open_seconds=round(logs.open_seconds, 6),
            partitions=len(logs.logs),
            offline=len(logs.offline),
            damaged_ranges=damaged,
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
