"""ENVELOPE (key 68): a request a node forwards on behalf of its caller (Kafka's Envelope,
KIP-590; docs/protocol.md, "ENVELOPE").

A node of a cluster that receives a queue request over HTTP for a queue another node owns
(or a definition change while another node leads ``__queue_definitions``) sends it there
wrapped in an ENVELOPE, with the caller's principal, rather than as itself: the receiving
node runs the inner request through the one gate (``server/needs.py`` and the authorizer) as
that principal, so the caller's own permissions decide there too and the audit log names the
caller (its interface marked as forwarded by the sending node), and the ``node`` role needs
no queue permissions of its own for it.

Only a sender with ``cluster_action`` on the cluster (a node's identity) may send an
envelope (checked by the listener as any API is); an envelope inside an envelope, or an API
not in :data:`ENVELOPE_APIS`, is refused. With authentication off the inner request is
anonymous, whatever the envelope names (as the caller was). The inner queue requests act as
the owner ``"http"`` (requests without a connection), as the HTTP API's own: what a
forwarded get takes is settled by a later forwarded ack, and is not tied to the connection
the envelope came on. The sending side is :func:`send_envelope`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tidewire.errors import InvalidRequestError, TidewireError, for_code
from tidewire.protocol.messages import (
    ApiKey,
    Body,
    EnvelopeRequest,
    EnvelopeResponse,
    decode_body,
    encode_body,
    schema_for,
)
from tidewire.server.gate import Gate, Session
from tidewire.server.needs import API_NEEDS
from tidewire.server.queue_handlers import QueueSession

if TYPE_CHECKING:
    from tidewire.broker import Broker
    from tidewire.client._transport import Transport
    from tidewire.protocol.connection import Connection

__all__ = ["ENVELOPE_APIS", "ENVELOPE_OWNER", "send_envelope", "serve_envelope"]

#: The APIs an envelope may carry: the queue requests that need no connection of their own
#: (a consumer does: it is refused, as is an envelope).
ENVELOPE_APIS = frozenset(
    {
        ApiKey.EXCHANGE_DECLARE,
        ApiKey.EXCHANGE_DELETE,
        ApiKey.QUEUE_DECLARE,
        ApiKey.QUEUE_DELETE,
        ApiKey.QUEUE_PURGE,
        ApiKey.QUEUE_BIND,
        ApiKey.QUEUE_UNBIND,
        ApiKey.LIST_QUEUES,
        ApiKey.LIST_EXCHANGES,
        ApiKey.QUEUE_PUBLISH,
        ApiKey.QUEUE_GET,
        ApiKey.QUEUE_SETTLE,
        ApiKey.QUEUE_BROWSE,
        ApiKey.QUEUE_REPLAY,
    }
)

#: The owner of what forwarded queue requests take: the HTTP API's (server/http/queues.py).
ENVELOPE_OWNER = "http"


def _nothing(_: Any) -> None:
    """A push writer for the envelope's queue session: it has no consumers, so nothing."""


async def serve_envelope(
    broker: Broker,
    gate: Gate,
    *,
    sender: Session,
    conn: Connection,
    req: EnvelopeRequest,
    data: memoryview,
) -> tuple[EnvelopeResponse, list[Any]]:
    """Answer an ENVELOPE whose sender the listener already let through (``cluster_action``
    on the cluster): the inner request checked as the carried principal, then run; the
    inner response (its data parts as the envelope's), or the refusal as the envelope's
    error."""
    try:
        key = _inner_key(req.request_api_key)
        inner = decode_body(schema_for(key, 0, response=False), req.request_body)
        via = f"node {req.forwarded_by}" if req.forwarded_by >= 0 else "a node"
        session = Session(
            source=req.client_source or sender.source,
            interface=f"{req.client_interface or 'binary'} (forwarded by {via})",
            tls=sender.tls,
            # Authentication off: anonymous, as the caller was, whatever the envelope says.
            principal_name=req.principal if gate.enabled else "",
            mechanism="envelope",
            cert_principal=None,
        )
        session.extra["principal_kind"] = req.principal_kind
        principal = gate.check(session, key.name, API_NEEDS.get(key), inner)
        gate.enter(session, principal)  # the handler's audit events name the caller
        queues = QueueSession(broker, conn, _nothing, asyncio.Event(), ENVELOPE_OWNER)
        body, parts = await queues.handle(key, inner, data)
    except TidewireError as exc:
        return EnvelopeResponse(error_code=exc.code, error_message=exc.message), []
    return EnvelopeResponse(response_body=encode_body(body)), list(parts)


def _inner_key(value: int) -> ApiKey:
    if value == ApiKey.ENVELOPE:
        raise InvalidRequestError("an ENVELOPE cannot carry an ENVELOPE")
    try:
        key = ApiKey(value)
    except ValueError:
        raise InvalidRequestError(f"ENVELOPE: unknown inner API key {value}") from None
    if key not in ENVELOPE_APIS:
        raise InvalidRequestError(
            f"ENVELOPE cannot carry {key.name}: only queue requests that need no connection"
        )
    return key


async def send_envelope(
    link: Transport,
    request: Body,
    data: Sequence[Any] = (),
    *,
    principal: str,
    principal_kind: str,
    client_source: str,
    client_interface: str,
    forwarded_by: int,
    timeout_s: float,
) -> tuple[Any, memoryview]:
    """Send ``request`` over ``link`` (to a node, as this node) in an ENVELOPE carrying the
    caller; the inner response's body (decoded) and data.

    Raises:
        TidewireError: the envelope or its inner request was refused as a whole (the
            receiving node's error), or the inner response's own error (its code's class).
    """
    key = ApiKey(request.api_key)
    envelope = EnvelopeRequest(
        request_api_key=int(key),
        request_body=encode_body(request),
        principal=principal,
        principal_kind=principal_kind,
        client_source=client_source,
        client_interface=client_interface,
        forwarded_by=forwarded_by,
    )
    response = await link.request(envelope, data, timeout_s=timeout_s)
    assert response is not None
    outer = response.body
    if outer.error_code:
        raise for_code(outer.error_code)(outer.error_message)
    inner = decode_body(schema_for(key, 0, response=True), outer.response_body)
    code = int(getattr(inner, "error_code", 0))
    if code:
        raise for_code(code)(str(getattr(inner, "error_message", "")))
    return inner, response.data
