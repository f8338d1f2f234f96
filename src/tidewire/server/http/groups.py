"""``/v1/groups``: list and describe consumer groups, commit offsets, reset (seek) them."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Request
from starlette.responses import Response

from tidewire.broker.consumer_groups import ResetTo
from tidewire.broker.groups import MAX_ID_CHARS
from tidewire.errors import InvalidRequestError, UnknownGroupError
from tidewire.security.model import ResourceType
from tidewire.server.gate import gate_for, names_allowed
from tidewire.server.http._common import json_response, parse_body, request_body, responses
from tidewire.server.http._listing import (
    DEFAULT_PAGE,
    LimitParam,
    OffsetParam,
    QueryParam,
    matching,
    paged,
)
from tidewire.server.http.context import GatewayContext
from tidewire.server.http.models import (
    CommitRequest,
    CommitResult,
    GroupDescription,
    GroupList,
    ResetRequest,
    ResetResult,
)

__all__ = ["groups_router"]

GroupSort = Literal["name", "-name", "state", "-state", "members", "-members", "lag", "-lag"]

GroupPath = Annotated[str, Path(description="The group id.", min_length=1, max_length=MAX_ID_CHARS)]


def groups_router(ctx: GatewayContext) -> APIRouter:
    """Consumer groups."""
    router = APIRouter(prefix="/v1/groups", tags=["groups"])
    broker = ctx.broker

    def total_lag(group: str) -> int:
        try:
            return sum(x.lag for x in broker.groups.describe(group).offsets if x.lag > 0)
        except UnknownGroupError:  # gone since it was listed
            return 0

    @router.get("", response_model=GroupList, responses=responses())
    async def list_groups(
        *,
        limit: LimitParam = DEFAULT_PAGE,
        offset: OffsetParam = 0,
        q: QueryParam = "",
        sort: Annotated[
            GroupSort,
            Query(description="Sort key, '-' in front for descending; ties by name."),
        ] = "name",
    ) -> Response:
        """The groups (with members or committed offsets) whose ids contain ``q``, sorted by
        ``sort``, ``limit`` from ``offset``: each with its state, member count and total
        lag; ``total`` counts those that match, ``next`` is the offset of the next page
        (null on the last)."""
        listed = {g.group_id: g for g in broker.groups.list_groups()}
        # Only what the caller may describe, as the binary protocol's LIST_GROUPS.
        visible = set(names_allowed(gate_for(broker), ResourceType.GROUP, listed))
        listed = {k: v for k, v in listed.items() if k in visible}
        lags: dict[str, int] = {}

        def lag(group: str) -> int:
            got = lags.get(group)
            if got is None:
                got = lags[group] = total_lag(group)
            return got

        page, total, after = paged(
            matching(listed, q),
            sort=sort,
            keys={
                "name": lambda g: g,
                "state": lambda g: str(listed[g].state),
                "members": lambda g: listed[g].members,
                "lag": lag,
            },
            offset=offset,
            limit=limit,
        )
        items = [
            {
                "group": g,
                "state": str(listed[g].state),
                "members": listed[g].members,
                "lag": lag(g),
            }
            for g in page
        ]
        return json_response({"groups": items, "total": total, "next": after})

    @router.get("/{group}", response_model=GroupDescription, responses=responses(404))
    async def describe_group(group: GroupPath) -> Response:
        """A group's state, members with their partitions, and per partition the committed
        offset, the end offset and the lag."""
        d = broker.groups.describe(group)
        return json_response(
            {
                "group": d.group_id,
                "state": str(d.state),
                "generation": d.generation,
                "strategy": d.strategy,
                "members": [
                    {
                        "member_id": m.member_id,
                        "group_instance_id": m.instance_id,
                        "client_id": m.client_id,
                        "topics": list(m.topics),
                        "pattern": m.pattern,
                        "assignment": [[t, p] for t, p in m.assignment],
                    }
                    for m in d.members
                ],
                "offsets": [
                    {
                        "topic": x.topic,
                        "partition": x.partition,
                        "committed": x.committed,
                        "end_offset": x.end_offset,
                        "lag": x.lag,
                        "metadata": x.metadata,
                    }
                    for x in d.offsets
                ],
            }
        )

    @router.post(
        "/{group}/commit",
        response_model=CommitResult,
        responses=responses(404, 409),
        openapi_extra={"requestBody": request_body(CommitRequest)},
    )
    async def commit(request: Request, group: GroupPath) -> Response:
        """Commit offsets (the next offset to read, per partition) durably: from outside the
        group (no ``member_id``) when it has no members, or as a member of its current
        generation for partitions assigned to it."""
        req = parse_body(CommitRequest, await request.body())
        offsets: dict[tuple[str, int], tuple[int, str]] = {}
        for c in req.offsets:
            if (c.topic, c.partition) in offsets:
                raise InvalidRequestError(f"{c.topic!r} partition {c.partition} is named twice")
            offsets[(c.topic, c.partition)] = (c.offset, c.metadata)
        await broker.groups.commit(
            group, offsets, member_id=req.member_id, generation=req.generation
        )
        return json_response({"group": group, "offsets": [c.model_dump() for c in req.offsets]})

    @router.post(
        "/{group}/reset",
        response_model=ResetResult,
        responses=responses(404, 409),
        openapi_extra={"requestBody": request_body(ResetRequest)},
    )
    async def reset(request: Request, group: GroupPath) -> Response:
        """Move the committed offsets of a group with no members for a topic (its
        ``partitions``, or all): to the oldest message, the end, an offset (clamped to each
        log's range) or the first message at or after a time; ``dry_run`` only says what
        would change (per partition: the offset before and after, the end offset and the
        lag left). The same operation as ``tidewire group reset``."""
        req = parse_body(ResetRequest, await request.body())
        value = 0
        if req.to == "offset":
            if req.offset is None:
                raise InvalidRequestError("field offset: required when to is 'offset'")
            value = req.offset
        elif req.to == "timestamp":
            if req.timestamp is None:
                raise InvalidRequestError("field timestamp: required when to is 'timestamp'")
            value = req.timestamp
        got = await broker.groups.reset(
            group,
            req.topic,
            ResetTo(req.to),
            partitions=req.partitions,
            value=value,
            dry_run=req.dry_run,
        )
        ends = {s.partition: s.high_watermark for s in broker.describe(req.topic)}
        return json_response(
            {
                "group": group,
                "dry_run": req.dry_run,
                "partitions": [
                    {
                        "topic": r.topic,
                        "partition": r.partition,
                        "previous": r.previous,
                        "offset": r.offset,
                        "end_offset": ends.get(r.partition, -1),
                        "lag": max(0, ends.get(r.partition, r.offset) - r.offset),
                    }
                    for r in got
                ],
            }
        )

    return router
