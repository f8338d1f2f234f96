"""The queue routes of the HTTP API in a cluster: a request another node serves (the queue's
owner; for declaring and deleting exchanges, queues and bindings, the leader of
``__queue_definitions``) is forwarded there on behalf of the caller (docs/cluster.md, "The
HTTP API in a cluster").

With ``http_cluster_routing = "forward"`` (the default) the node the client reached, which
has checked the caller's permissions already, sends the request as the binary protocol's
request in an ENVELOPE (:mod:`tidewire.server.envelope`) carrying the caller's principal,
over the node's shared connections to the other nodes (its identity: a principal with
``cluster_action``); the serving node checks the caller again and runs it as the caller, and
its answer is this node's. So the ``node`` role needs no queue permissions for it, and an
``Authorization`` header is never asked to follow a redirect. A request nobody serves now, or
whose connection broke before its answer, is ``503`` with ``Retry-After`` (a get or replay
whose connection broke may have been done: a got message not settled is delivered again after
its visibility timeout). With ``"redirect"`` the request is answered ``307`` as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tidewire.cluster import cluster_node
from tidewire.errors import NotLeaderError
from tidewire.protocol.messages import Body
from tidewire.server.envelope import send_envelope
from tidewire.server.gate import CURRENT_SESSION, gate_for
from tidewire.server.http.cluster import no_redirect
from tidewire.server.http.context import GatewayContext
from tidewire.server.http.peers import PEER_TIMEOUT_S, node_transports, peer_pool

__all__ = ["forward_to_server", "not_served_here"]


async def forward_to_server(
    ctx: GatewayContext,
    exc: NotLeaderError,
    request: Body,
    data: Sequence[Any] = (),
    *,
    timeout_s: float = PEER_TIMEOUT_S,
) -> tuple[Any, memoryview]:
    """``request`` (the binary protocol's form of the HTTP request being answered) sent to
    the node ``exc`` names (the queue's owner or the definitions' leader) on behalf of the
    current request's principal; the inner response's body and data.

    Raises:
        NotLeaderError: ``exc`` itself in redirect mode (answered ``307``); without the node
            it named (``503``, retry) when that node is not known or is this one.
        TidewireError: the serving node's refusal (the caller's permissions there
            included), or ConnectionLostError / RequestTimedOutError (``503``).
    """
    node = cluster_node(ctx.broker)
    if node is None or ctx.config.http_cluster_routing == "redirect":
        raise exc
    info = node.cache.nodes.get(exc.leader_id)
    if info is None or exc.leader_id == node.node_id:
        raise no_redirect(exc)
    session = CURRENT_SESSION.get()
    gate = gate_for(ctx.broker)
    principal = None if session is None else gate.principal(session)
    pool = peer_pool(node)
    link = pool.link(info.address) if pool is not None else node_transports(node)(info.address)
    try:
        return await send_envelope(
            link,
            request,
            data,
            principal="" if principal is None else principal.name,
            principal_kind="" if principal is None else principal.kind,
            client_source="" if session is None else session.source,
            client_interface="http" if session is None else session.interface,
            forwarded_by=node.node_id,
            timeout_s=timeout_s,
        )
    finally:
        await link.close()  # a pool's connection stays open for the others


def not_served_here(ctx: GatewayContext, exc: NotLeaderError) -> NotLeaderError:
    """What a request another node serves and this one cannot forward now is answered with:
    ``exc`` (``307`` to that node) in redirect mode, else ``503`` with ``Retry-After``."""
    return exc if ctx.config.http_cluster_routing == "redirect" else no_redirect(exc)
