"""``/v1/exchanges``, ``/v1/queues``, ``/v1/bindings``: declare, list, describe and delete
exchanges and queues, purge queues, bind and unbind (the broker core's QueueManager, as the
binary protocol's APIs 41-49 reach it).

Requests without a connection act as the owner ``"http"``: an exclusive queue of a
connection answers 423 to them, and they cannot declare one (an exclusive queue lives as
long as the connection that declared it). Queue and exchange names with a ``/`` cannot be
named in a path; the binary protocol reaches them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from starlette.responses import Response

from tidewire.broker import Broker
from tidewire.broker.queues.model import Binding, ExchangeSpec, QueueSpec, QueueStatus
from tidewire.errors import (
    InvalidRequestError,
    NotLeaderError,
    UnknownExchangeError,
    UnknownQueueError,
)
from tidewire.protocol import messages as wire
from tidewire.security.model import ResourceType
from tidewire.server.gate import gate_for, names_allowed
from tidewire.server.http._common import json_response, parse_body, request_body
from tidewire.server.http._listing import (
    DEFAULT_PAGE,
    LimitParam,
    OffsetParam,
    QueryParam,
    matching,
    paged,
)
from tidewire.server.http._queue_docs import (
    DEFAULT_EXCHANGE_PATH,
    binding_doc,
    exchange_doc,
    exchange_name,
    queue_doc,
)
from tidewire.server.http.context import GatewayContext
from tidewire.server.http.models import ErrorBody
from tidewire.server.http.queue_forward import forward_to_server, not_served_here
from tidewire.server.http.queue_models import (
    BindingList,
    BindingRequest,
    ExchangeDeclareRequest,
    ExchangeDescription,
    ExchangeInfo,
    ExchangeList,
    MessageCount,
    QueueDeclareRequest,
    QueueInfo,
    QueueList,
)
from tidewire.server.http.queue_owners import owner_of, with_counts, with_owners_counts

__all__ = ["HTTP_OWNER", "queue_responses", "queues_router"]

#: The owner of what a request without a connection does (gets, settles, declares).
HTTP_OWNER = "http"

_WHAT = {
    400: "A malformed request, or a name or setting that is not allowed (named).",
    404: "No such queue or exchange (or delivery's queue).",
    409: "Declared already with other settings; or its state forbids it (not empty, in "
    "use); or a delivery tag not held by HTTP requests (the others were settled).",
    413: "The body exceeds http_max_body_bytes, or the batch a queue's limit.",
    422: "A mandatory message that no binding routes (nothing was stored).",
    423: "The queue is exclusive to another connection.",
    429: "A queue at its max_length or max_length_bytes with overflow reject-publish: "
    "nothing was stored; retry after Retry-After.",
    503: "The broker is busy or its storage refused; retry after Retry-After.",
    307: "In a cluster with http_cluster_routing = redirect: another node serves this: the "
    "queue's owner, or for a change of exchanges, queues and bindings the leader of "
    "__queue_definitions; Location names the same request on its HTTP listener (by "
    'default the node forwards it there instead: docs/cluster.md, "The HTTP API in a '
    'cluster").',
}


def queue_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI documentation of the error answers of a queue route (400 and 503 always; 307
    too: in a cluster, another node may serve it)."""
    return {
        s: {"model": ErrorBody, "description": _WHAT[s]} for s in sorted({307, 400, 503, *statuses})
    }


NamePath = Annotated[
    str,
    Path(
        description=f"The name (the default exchange: {DEFAULT_EXCHANGE_PATH}).",
        min_length=1,
        max_length=255,
    ),
]
QueueSort = Literal[
    "name",
    "-name",
    "ready",
    "-ready",
    "unacked",
    "-unacked",
    "consumers",
    "-consumers",
    "bytes",
    "-bytes",
]


def _queue_spec(name: str, req: QueueDeclareRequest) -> QueueSpec:
    if req.exclusive:
        raise InvalidRequestError(
            "exclusive: an exclusive queue belongs to the connection that declares it; "
            "declare it over the binary protocol"
        )
    dlx = None if req.dead_letter_exchange is None else exchange_name(req.dead_letter_exchange)
    return QueueSpec(
        name=name,
        durable=req.durable,
        exclusive=False,
        auto_delete=req.auto_delete,
        max_deliveries=req.max_deliveries,
        message_ttl_ms=req.message_ttl_ms,
        max_length=req.max_length,
        max_length_bytes=req.max_length_bytes,
        overflow=req.overflow,
        dead_letter_exchange=dlx,
        dead_letter_routing_key=req.dead_letter_routing_key,
        visibility_timeout_ms=req.visibility_timeout_ms,
    )


def _binding(req: BindingRequest) -> Binding:
    return Binding(
        exchange=exchange_name(req.exchange),
        destination=req.destination,
        destination_kind=req.destination_kind,
        key=req.key,
        arguments=tuple(sorted(req.arguments.items())),
    )


def _acl_name(exchange: str) -> str:
    """The name ACLs give an exchange (the default one: amq.default)."""
    return exchange or DEFAULT_EXCHANGE_PATH


def owner_of_any(broker: Broker, names: Iterable[str]) -> bool:
    """Whether another node of a cluster serves one of the queues ``names``."""
    return any(owner_of(broker, n) is not None for n in names)


def queues_router(ctx: GatewayContext) -> APIRouter:
    """Exchanges, queues and bindings."""
    router = APIRouter(tags=["queues"])
    broker = ctx.broker

    # --- exchanges ------------------------------------------------------------------------------

    @router.get("/v1/exchanges", response_model=ExchangeList, responses=queue_responses())
    async def list_exchanges() -> Response:
        """The exchanges the caller may describe (the default one, named "", included)."""
        every = {_acl_name(x.name): x for x in broker.queues.exchanges()}
        allowed = names_allowed(gate_for(broker), ResourceType.EXCHANGE, every)
        shown = sorted((every[n] for n in allowed), key=lambda x: x.name)
        return json_response({"exchanges": [exchange_doc(x) for x in shown]})

    @router.get(
        "/v1/exchanges/{name}",
        response_model=ExchangeDescription,
        responses=queue_responses(404),
    )
    async def describe_exchange(name: NamePath) -> Response:
        """An exchange's settings and the bindings from it."""
        ex = exchange_name(name)
        manager = broker.queues
        found = [x for x in manager.exchanges() if x.name == ex]
        if not found:
            raise UnknownExchangeError(f"exchange {name!r} does not exist")
        bindings = manager.bindings(exchange=ex)
        return json_response(
            exchange_doc(found[0]) | {"bindings": [binding_doc(b) for b in bindings]}
        )

    @router.put(
        "/v1/exchanges/{name}",
        response_model=ExchangeInfo,
        status_code=201,
        responses=queue_responses(404, 409) | {200: {"description": "It existed already."}},
        openapi_extra={"requestBody": request_body(ExchangeDeclareRequest)},
    )
    async def declare_exchange(request: Request, name: NamePath) -> Response:
        """Declare an exchange: 201 when made, 200 when it existed with these settings, 409
        when it exists with others. ``alternate_exchange`` must exist (404)."""
        body = await request.body()
        req = parse_body(ExchangeDeclareRequest, body or b"{}")
        ex = exchange_name(name)
        manager = broker.queues
        existed = any(x.name == ex for x in manager.exchanges())
        spec = ExchangeSpec(
            name=ex,
            type=req.type,
            durable=req.durable,
            alternate_exchange=exchange_name(req.alternate_exchange),
        )
        try:
            spec = await manager.declare_exchange(spec)
        except NotLeaderError as exc:  # a cluster: its definitions' leader declares it
            forwarded = wire.ExchangeDeclareRequest(
                name=spec.name,
                type=spec.type,
                durable=spec.durable,
                alternate_exchange=spec.alternate_exchange,
            )
            await forward_to_server(ctx, exc, forwarded)
        return json_response(exchange_doc(spec), 200 if existed else 201)

    @router.delete(
        "/v1/exchanges/{name}",
        status_code=204,
        response_class=Response,
        responses=queue_responses(404, 409),
    )
    async def delete_exchange(
        name: NamePath,
        if_unused: Annotated[
            bool, Query(description="Refuse (409) when the exchange has bindings.")
        ] = False,
    ) -> Response:
        """Delete an exchange and its bindings (never the default one: 400)."""
        ex = exchange_name(name)
        try:
            await broker.queues.delete_exchange(ex, if_unused=if_unused)
        except NotLeaderError as exc:
            await forward_to_server(
                ctx, exc, wire.ExchangeDeleteRequest(name=ex, if_unused=if_unused)
            )
        return Response(status_code=204)

    # --- bindings -------------------------------------------------------------------------------

    @router.get("/v1/bindings", response_model=BindingList, responses=queue_responses())
    async def list_bindings(
        exchange: Annotated[
            str | None, Query(max_length=255, description="Only those from this exchange.")
        ] = None,
        destination: Annotated[
            str | None, Query(max_length=255, description="Only those to this queue or topic.")
        ] = None,
    ) -> Response:
        """The bindings from exchanges the caller may describe."""
        got = broker.queues.bindings(
            exchange=None if exchange is None else exchange_name(exchange),
            destination=destination,
        )
        names = {_acl_name(b.exchange) for b in got}
        allowed = set(names_allowed(gate_for(broker), ResourceType.EXCHANGE, names))
        return json_response(
            {"bindings": [binding_doc(b) for b in got if _acl_name(b.exchange) in allowed]}
        )

    @router.post(
        "/v1/bindings",
        response_model=BindingList,
        status_code=201,
        responses=queue_responses(404),
        openapi_extra={"requestBody": request_body(BindingRequest)},
    )
    async def bind(request: Request) -> Response:
        """Bind an exchange to a queue or a topic (both must exist: 404); binding again
        changes nothing."""
        b = _binding(parse_body(BindingRequest, await request.body()))
        try:
            await broker.queues.bind(b)
        except NotLeaderError as exc:
            await forward_to_server(ctx, exc, wire.QueueBindRequest(**binding_doc(b)))
        return json_response({"bindings": [binding_doc(b)]}, 201)

    @router.delete(
        "/v1/bindings",
        status_code=204,
        response_class=Response,
        responses=queue_responses(404),
        openapi_extra={"requestBody": request_body(BindingRequest)},
    )
    async def unbind(request: Request) -> Response:
        """Remove a binding (the body names it as it was made); one that does not exist
        changes nothing."""
        b = _binding(parse_body(BindingRequest, await request.body()))
        try:
            await broker.queues.unbind(b)
        except NotLeaderError as exc:
            await forward_to_server(ctx, exc, wire.QueueUnbindRequest(**binding_doc(b)))
        return Response(status_code=204)

    # --- queues ---------------------------------------------------------------------------------

    @router.get("/v1/queues", response_model=QueueList, responses=queue_responses())
    async def list_queues(
        *,
        limit: LimitParam = DEFAULT_PAGE,
        offset: OffsetParam = 0,
        q: QueryParam = "",
        sort: Annotated[
            QueueSort,
            Query(description="Sort key, '-' in front for descending; ties by name."),
        ] = "name",
    ) -> Response:
        """The queues the caller may describe whose names contain ``q``, sorted by ``sort``,
        ``limit`` from ``offset``: each with its settings, messages (ready, unacked,
        delayed, bytes), consumers and counters; ``total`` counts those that match."""
        every = {s.spec.name: s for s in broker.queues.queues()}
        visible = names_allowed(gate_for(broker), ResourceType.QUEUE, every)
        if owner_of_any(broker, visible):  # a cluster: other nodes count some of them
            every |= {
                s.spec.name: s
                for s in await with_owners_counts(broker, [every[n] for n in visible])
            }
        page, total, after = paged(
            matching(visible, q),
            sort=sort,
            keys={
                "name": lambda n: n,
                "ready": lambda n: every[n].ready,
                "unacked": lambda n: every[n].unacked,
                "consumers": lambda n: every[n].consumers,
                "bytes": lambda n: every[n].bytes,
            },
            offset=offset,
            limit=limit,
        )
        return json_response(
            {"queues": [queue_doc(every[n]) for n in page], "total": total, "next": after}
        )

    @router.get("/v1/queues/{name}", response_model=QueueInfo, responses=queue_responses(404))
    async def describe_queue(name: NamePath) -> Response:
        """A queue's settings, messages, consumers and counters (in a cluster, as its owner
        counts them: asked of it when another node serves the queue)."""
        try:
            return json_response(queue_doc(broker.queues.describe_queue(name)))
        except NotLeaderError as exc:
            listed = [s for s in broker.queues.queues() if s.spec.name == name]
            if not listed or owner_of(broker, name) is None:
                raise not_served_here(ctx, exc) from None  # no owner to ask now
            (status,) = await with_owners_counts(broker, listed)
            if status is listed[0]:  # the owner did not answer: 503 (redirect mode: 307)
                raise not_served_here(ctx, exc) from None
            return json_response(queue_doc(status))

    @router.put(
        "/v1/queues/{name}",
        response_model=QueueInfo,
        status_code=201,
        responses=queue_responses(404, 409, 423) | {200: {"description": "It existed already."}},
        openapi_extra={"requestBody": request_body(QueueDeclareRequest)},
    )
    async def declare_queue(request: Request, name: NamePath) -> Response:
        """Declare a queue: 201 when made, 200 when it existed with these settings, 409
        when it exists with others (the body may be empty: every default)."""
        body = await request.body()
        spec = _queue_spec(name, parse_body(QueueDeclareRequest, body or b"{}"))
        manager = broker.queues
        try:
            manager.describe_queue(name)
            existed = True
        except UnknownQueueError:
            existed = False
        except NotLeaderError:  # a cluster: it exists, and another node serves it
            existed = True
        try:
            status = await manager.declare_queue(spec, owner=HTTP_OWNER)
        except NotLeaderError as exc:  # a cluster: its definitions' leader declares it
            got, _ = await forward_to_server(ctx, exc, _declare_request(spec))
            status = with_counts(QueueStatus(spec, 0, 0, 0, 0, 0), got.queue)
        return json_response(queue_doc(status), 200 if existed else 201)

    @router.delete(
        "/v1/queues/{name}",
        response_model=MessageCount,
        responses=queue_responses(404, 409, 423),
    )
    async def delete_queue(
        name: NamePath,
        if_empty: Annotated[bool, Query(description="Refuse (409) unless it is empty.")] = False,
        if_unused: Annotated[
            bool, Query(description="Refuse (409) while it has consumers.")
        ] = False,
    ) -> Response:
        """Delete a queue, its messages and its bindings; answers how many messages went."""
        try:
            dropped = await broker.queues.delete_queue(
                name, if_empty=if_empty, if_unused=if_unused, owner=HTTP_OWNER
            )
        except NotLeaderError as exc:  # a cluster: its definitions' leader deletes it
            request = wire.QueueDeleteRequest(name=name, if_empty=if_empty, if_unused=if_unused)
            got, _ = await forward_to_server(ctx, exc, request)
            dropped = got.messages
        return json_response({"queue": name, "messages": dropped})

    @router.post(
        "/v1/queues/{name}/purge",
        response_model=MessageCount,
        responses=queue_responses(404, 423),
    )
    async def purge_queue(name: NamePath) -> Response:
        """Remove a queue's ready messages (those delivered and not settled stay); answers
        how many went."""
        try:
            purged = await broker.queues.purge_queue(name, owner=HTTP_OWNER)
        except NotLeaderError as exc:  # a cluster: its owner purges it
            got, _ = await forward_to_server(ctx, exc, wire.QueuePurgeRequest(name=name))
            purged = got.messages
        return json_response({"queue": name, "messages": purged})

    return router


def _declare_request(spec: QueueSpec) -> wire.QueueDeclareRequest:
    """The binary protocol's form of declaring ``spec``."""
    return wire.QueueDeclareRequest(
        name=spec.name,
        durable=spec.durable,
        auto_delete=spec.auto_delete,
        max_deliveries=spec.max_deliveries,
        message_ttl_ms=spec.message_ttl_ms,
        max_length=spec.max_length,
        max_length_bytes=spec.max_length_bytes,
        overflow=spec.overflow,
        dead_letter_exchange=spec.dead_letter_exchange,
        dead_letter_routing_key=spec.dead_letter_routing_key,
        visibility_timeout_ms=spec.visibility_timeout_ms,
    )
