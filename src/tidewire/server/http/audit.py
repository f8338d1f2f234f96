"""``/v1/audit``: read the audit log (who did what, from where, allowed or denied)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from fastapi import APIRouter, Query
from pydantic import BaseModel, Field
from starlette.responses import Response

from tidewire.cluster import cluster_node
from tidewire.errors import InvalidRequestError
from tidewire.security.audit import MAX_QUERY_LIMIT
from tidewire.security.audit import AuditEvent as AuditLogEvent
from tidewire.server.http._common import json_response, responses
from tidewire.server.http.context import GatewayContext

__all__ = ["AuditEvent", "AuditPage", "audit_router"]

#: Events answered unless ``limit`` says otherwise.
DEFAULT_LIMIT = 1000

Outcome = Literal["allowed", "denied", "failed", "ok"]


class AuditEvent(BaseModel):
    time_ms: int = Field(description="When, ms since the epoch.")
    principal: str | None = Field(description="Who; null: anonymous, or not known.")
    source: str = Field(description="The client's host:port; empty when not known.")
    interface: str = Field(
        description="binary, http, websocket, sse, msgbus, ipubsub, kafka or cli."
    )
    action: str = Field(
        description="The API or route (CREATE_TOPIC, POST /v1/topics), or authenticate, "
        "acl.add, key.create, key.revoke, ..."
    )
    resource: str = Field(description="topic:NAME, group:ID, cluster, principal:NAME; or empty.")
    outcome: Outcome
    reason: str = Field(description="Why, in a few words (never a secret).")
    detail: dict[str, str] = Field(description="More, as text.")
    node_id: int | None = Field(
        default=None,
        description="In a cluster: the node that recorded it (absent on a single node).",
    )


class AuditPage(BaseModel):
    events: list[AuditEvent] = Field(description="The newest that match, oldest first.")
    missing_nodes: list[int] = Field(
        default_factory=list,
        description="In a cluster (absent on a single node): the nodes whose audit logs no "
        "node answered for in time; their events are missing (a partial answer). Empty: "
        "every node's events.",
    )


def _doc(e: AuditLogEvent) -> dict[str, object]:
    doc = msgspec.structs.asdict(e)
    if doc["node_id"] is None:  # a single node's events: as before clusters
        del doc["node_id"]
    return doc


def audit_router(ctx: GatewayContext) -> APIRouter:
    """The audit log."""
    router = APIRouter(prefix="/v1/audit", tags=["audit"])
    broker = ctx.broker

    @router.get("", response_model=AuditPage, responses=responses())
    async def read_audit(
        *,
        since: Annotated[
            int | None,
            Query(ge=0, le=2**63 - 1, description="ms since the epoch: events at or after."),
        ] = None,
        until: Annotated[
            int | None,
            Query(ge=0, le=2**63 - 1, description="ms since the epoch: events before."),
        ] = None,
        principal: Annotated[
            str | None,
            Query(max_length=255, description="Only this principal's (empty: anonymous)."),
        ] = None,
        action: Annotated[str | None, Query(max_length=255, description="Only this action.")] = (
            None
        ),
        outcome: Annotated[Outcome | None, Query(description="Only this outcome.")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_QUERY_LIMIT)] = DEFAULT_LIMIT,
    ) -> Response:
        """The newest ``limit`` audit events that match every filter given, oldest first:
        authentications, administrative operations, ACL and key changes, and denials. In a
        cluster: every node's events (each with its ``node_id``), from any node; a node
        that does not answer in time leaves its nodes' logs out, named in
        ``missing_nodes`` (still 200: a partial answer)."""
        if broker.audit is None:
            raise InvalidRequestError("the broker is not running")
        events, missing = await broker.audit.answer(
            since_ms=since,
            until_ms=until,
            principal=principal,
            action=action,
            outcome=outcome,
            limit=limit,
        )
        doc: dict[str, object] = {"events": [_doc(e) for e in events]}
        if cluster_node(broker) is not None:  # a single node's answer: as before clusters
            doc["missing_nodes"] = list(missing)
        return json_response(doc)

    return router
