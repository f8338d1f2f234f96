"""``/v1/groups``: list and describe consumer groups, commit offsets, reset (seek) them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from starlette.responses import Response

from tidewire.broker import Broker
from tidewire.broker.consumer_groups import ResetResult, ResetTo
from tidewire.broker.groups import MAX_ID_CHARS
from tidewire.cluster import cluster_node
from tidewire.errors import InvalidRequestError, NotCoordinatorError, UnknownGroupError
from tidewire.protocol.messages import (
    CommitPartition,
    DescribeGroupRequest,
    DescribeGroupResponse,
    GroupSummary,
    ListGroupsRequest,
    OffsetCommitRequest,
    ResetOffsetsRequest,
)
from tidewire.security.model import ResourceType
from tidewire.server.gate import gate_for, names_allowed
from tidewire.server.handlers import describe_response
from tidewire.server.http._common import json_response, parse_body, request_body, responses
from tidewire.server.http._listing import (
    DEFAULT_PAGE,
    LimitParam,
    OffsetParam,
    QueryParam,
    matching,
    paged,
)
from tidewire.server.http.cluster import require_coordinator
from tidewire.server.http.context import GatewayContext
from tidewire.server.http.models import (
    CommitRequest,
    CommitResult,
    GroupDescription,
    GroupList,
    ResetRequest,
)
from tidewire.server.http.models import ResetResult as ResetResultDoc
from tidewire.server.http.peers import PeerClient

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
        node = cluster_node(broker)
        if node is not None:
            return await _list_cluster_groups(
                broker, PeerClient(node), limit=limit, offset=offset, q=q, sort=sort
            )
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

        return _group_page(listed, lag, limit=limit, offset=offset, q=q, sort=sort)

    @router.get("/{group}", response_model=GroupDescription, responses=responses(307, 404))
    async def describe_group(group: GroupPath) -> Response:
        """A group's state, members with their partitions, and per partition the committed
        offset, the end offset and the lag. In a cluster, answered by the group's
        coordinator (another node forwards it there, or redirects)."""
        peer = await _coordinator_elsewhere(ctx, group)
        if peer is not None:
            try:
                got = await peer.group_body(group, DescribeGroupRequest(group_id=group))
            finally:
                await peer.close()
            return json_response(_described(got))
        return json_response(_described(describe_response(broker.groups.describe(group))))

    @router.post(
        "/{group}/commit",
        response_model=CommitResult,
        responses=responses(307, 404, 409),
        openapi_extra={"requestBody": request_body(CommitRequest)},
    )
    async def commit(request: Request, group: GroupPath) -> Response:
        """Commit offsets (the next offset to read, per partition) durably: from outside the
        group (no ``member_id``) when it has no members, or as a member of its current
        generation for partitions assigned to it. In a cluster, made by the group's
        coordinator (another node forwards it there, or redirects)."""
        peer = await _coordinator_elsewhere(ctx, group)
        req = parse_body(CommitRequest, await request.body())
        offsets: dict[tuple[str, int], tuple[int, str]] = {}
        for c in req.offsets:
            if (c.topic, c.partition) in offsets:
                raise InvalidRequestError(f"{c.topic!r} partition {c.partition} is named twice")
            offsets[(c.topic, c.partition)] = (c.offset, c.metadata)
        if peer is None:
            await broker.groups.commit(
                group, offsets, member_id=req.member_id, generation=req.generation
            )
        else:
            commit_req = OffsetCommitRequest(
                group_id=group,
                member_id=req.member_id,
                generation=req.generation,
                partitions=[CommitPartition(t, p, o, m) for (t, p), (o, m) in offsets.items()],
            )
            try:
                await peer.group_body(group, commit_req)
            finally:
                await peer.close()
        return json_response({"group": group, "offsets": [c.model_dump() for c in req.offsets]})

    @router.post(
        "/{group}/reset",
        response_model=ResetResultDoc,
        responses=responses(307, 404, 409),
        openapi_extra={"requestBody": request_body(ResetRequest)},
    )
    async def reset(request: Request, group: GroupPath) -> Response:
        """Move the committed offsets of a group with no members for a topic (its
        ``partitions``, or all): to the oldest message, the end, an offset (clamped to each
        log's range) or the first message at or after a time; ``dry_run`` only says what
        would change (per partition: the offset before and after, the end offset and the
        lag left). The same operation as ``tidewire group reset``. In a cluster, made by the
        group's coordinator (another node forwards it there, or redirects)."""
        peer = await _coordinator_elsewhere(ctx, group)
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
        if peer is not None:
            try:
                answer = await peer.group_body(
                    group,
                    ResetOffsetsRequest(
                        group_id=group,
                        topic=req.topic,
                        partitions=req.partitions,
                        to=req.to,
                        value=value,
                        dry_run=req.dry_run,
                    ),
                )
                got = [
                    ResetResult(r.topic, r.partition, r.previous, r.offset) for r in answer.results
                ]
                ends = await _ends_from_leaders(broker, peer, req.topic, got)
            finally:
                await peer.close()
        else:
            got = await broker.groups.reset(
                group,
                req.topic,
                ResetTo(req.to),
                partitions=req.partitions,
                value=value,
                dry_run=req.dry_run,
            )
            if broker.replication is None:
                ends = {s.partition: s.high_watermark for s in broker.describe(req.topic)}
            else:  # the coordinator holds what it reset, not always the topic's others
                ends = {r.partition: broker.high_watermark(r.topic, r.partition) for r in got}
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


async def _ends_from_leaders(
    broker: Broker, peer: PeerClient, topic: str, got: list[ResetResult]
) -> dict[int, int]:
    """The high watermark of each partition a forwarded reset answered for: this node's
    where it holds a replica, else its leader's (as a read of it forwarded there)."""
    ends: dict[int, int] = {}
    for r in got:
        if (topic, r.partition) in broker.logs.logs:
            ends[r.partition] = broker.high_watermark(topic, r.partition)
        else:
            ends[r.partition] = await peer.list_offset(topic, r.partition, -1)
    return ends


async def _coordinator_elsewhere(ctx: GatewayContext, group: str) -> PeerClient | None:
    """None when this node coordinates ``group`` (or is no node of a cluster); in a cluster
    forwarding requests (``http_cluster_routing = "forward"``), a client to send the request
    to its coordinator (the caller closes it).

    Raises:
        NotCoordinatorError: another node coordinates it and requests are redirected there
            (307), or it has no coordinator now (503).
    """
    try:
        await require_coordinator(ctx.broker, group)
    except NotCoordinatorError as exc:
        node = cluster_node(ctx.broker)
        if node is None or exc.leader_id < 0 or ctx.config.http_cluster_routing != "forward":
            raise
        return PeerClient(node)
    return None


def _described(d: DescribeGroupResponse) -> dict[str, Any]:
    """The GroupDescription document of a DESCRIBE_GROUP answer: another coordinator's,
    forwarded, or this node's own (:func:`~tidewire.server.handlers.describe_response`)."""
    return {
        "group": d.group_id,
        "state": d.state,
        "generation": d.generation,
        "strategy": d.strategy,
        "members": [
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "client_id": m.client_id,
                "topics": list(m.topics),
                "pattern": m.pattern,
                "assignment": [[a.topic, a.partition] for a in m.assignment],
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


def _group_page(
    listed: Mapping[str, Any],
    lag: Callable[[str], int],
    *,
    limit: int,
    offset: int,
    q: str,
    sort: str,
) -> Response:
    """One page of the GroupList document over ``listed`` (group id -> a summary with its
    ``state`` and ``members``)."""
    page, total, after = paged(
        matching(listed, q), sort=sort, keys=_sort_keys(listed, lag), offset=offset, limit=limit
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


def _sort_keys(listed: Mapping[str, Any], lag: Callable[[str], int]) -> dict[str, Any]:
    return {
        "name": lambda g: g,
        "state": lambda g: str(listed[g].state),
        "members": lambda g: listed[g].members,
        "lag": lag,
    }


async def _list_cluster_groups(
    broker: Broker, peer: PeerClient, *, limit: int, offset: int, q: str, sort: str
) -> Response:
    """GET /v1/groups on a node of a cluster: the groups of every node (each lists those it
    coordinates, as ``tidewire group list`` asks them), the lag of each listed from its
    coordinator. Asked as this node (peers.py), so only what the caller may describe is kept
    here, as on a single node."""
    try:
        listed: dict[str, GroupSummary] = {}
        for body in await peer.ask_every_node(ListGroupsRequest()):
            for g in body.groups:
                # A coordinator that moved a moment ago may be listed by both nodes: the one
                # with members is the one serving the group.
                if g.group_id not in listed or g.members > listed[g.group_id].members:
                    listed[g.group_id] = g
        visible = set(names_allowed(gate_for(broker), ResourceType.GROUP, listed))
        listed = {k: v for k, v in listed.items() if k in visible}
        lags: dict[str, int] = {}
        matched = matching(listed, q)
        # The lags the page needs (every match's when sorted by lag), asked up front: the
        # page is made by a synchronous sort.
        wanted = matched if sort in ("lag", "-lag") else None
        if wanted is None:
            keys = _sort_keys(listed, lambda g: 0)
            wanted, _, _ = paged(matched, sort=sort, keys=keys, offset=offset, limit=limit)
        for g in wanted:
            d = await peer.group_request(g, DescribeGroupRequest(group_id=g))
            lags[g] = 0 if d.error_code else sum(x.lag for x in d.offsets if x.lag > 0)
    finally:
        await peer.close()
    return _group_page(listed, lambda g: lags.get(g, 0), limit=limit, offset=offset, q=q, sort=sort)
