"""What a Kafka API handler is given: the broker, the gate and the connection's session,
the listener's identity, the request header and what the gate denied.

A handler is ``async (ctx, api_version, body) -> response body | None``: it reads the decoded
request body (a dict, :mod:`tidewire.protocol.kafka`) and returns the response body as a dict
(None: no response at all, as for a produce with acks=0). Handlers never see bytes on the
wire.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tidewire.broker import Broker
    from tidewire.protocol.kafka import RequestHeader
    from tidewire.server.gate import Gate, Session
    from tidewire.server.needs import Need

__all__ = ["KafkaContext", "KafkaHandler"]


@dataclass(slots=True)
class KafkaContext:
    """One request's surroundings.

    Attributes:
        node_id: this broker's id in Metadata answers.
        host, port: the address clients are told to connect to (advertised).
        cluster_id: the id Metadata and DescribeCluster answer.
        denied: the needs of this request that the gate refused; the handler answers those
            resources with the matching authorization error and serves the rest.
    """

    broker: Broker
    gate: Gate
    session: Session
    header: RequestHeader
    node_id: int
    host: str
    port: int
    cluster_id: str
    denied: frozenset[Need] = field(default_factory=frozenset)

    def allowed(self, need: Need) -> bool:
        """Whether the gate let ``need`` through for this request."""
        return need not in self.denied


KafkaHandler = Callable[[KafkaContext, int, dict[str, Any]], Awaitable[dict[str, Any] | None]]
