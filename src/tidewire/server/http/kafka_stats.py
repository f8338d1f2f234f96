"""``GET /v1/stats/kafka``: the Kafka listener's figures (where it listens, connections,
bytes, requests and errors by API, latency), as the ``tidewire_kafka_*`` metrics hold them
(observability/kafka_metrics.py); the dashboard's Kafka page polls it.

With authentication on it needs describe on the cluster, as the other stats routes.
"""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field
from starlette.responses import Response

from tidewire.observability.kafka_metrics import kafka_stats_doc, kafka_stats_of
from tidewire.server.http._common import json_response
from tidewire.server.http.context import GatewayContext
from tidewire.server.http.models import ErrorBody

__all__ = ["KafkaApiStatsDoc", "KafkaStatsDoc", "kafka_stats_router"]


class KafkaApiStatsDoc(BaseModel):
    """One Kafka API's counts since the broker started."""

    api: str = Field(description="The API's name in lower case (produce, fetch, ...; other).")
    requests: int
    errors: int = Field(description="Requests answered with a top-level error code.")
    versions: dict[str, int] = Field(description="Requests by version.")
    errors_by: dict[str, int] = Field(description="Errors by Kafka's error name.")
    mean_ms: float | None = Field(description="Mean latency, ms (null without requests).")
    p50_ms: float | None = Field(description="Upper bound of the median latency, ms.")
    p99_ms: float | None = Field(description="Upper bound of the 99th percentile, ms.")


class KafkaAuthStatsDoc(BaseModel):
    mechanism: str
    result: str = Field(description="ok or failed.")
    count: int


class KafkaStatsDoc(BaseModel):
    """The Kafka listener's figures (zeros and ``listening`` false without one)."""

    listening: bool
    host: str | None
    port: int | None = Field(description="The Kafka port, null while not listening.")
    connections: int = Field(description="Connections open now.")
    accepted: int = Field(description="Connections accepted.")
    received_bytes: int
    sent_bytes: int
    requests: int
    errors: int
    apis: list[KafkaApiStatsDoc]
    authentications: list[KafkaAuthStatsDoc]


def kafka_stats_router(ctx: GatewayContext) -> APIRouter:
    """The route ``/v1/stats/kafka``."""
    router = APIRouter(tags=["kafka"])
    broker = ctx.broker

    @router.get(
        "/v1/stats/kafka",
        response_model=KafkaStatsDoc,
        responses={403: {"model": ErrorBody, "description": "Without describe on the cluster."}},
    )
    async def kafka_stats() -> Response:
        """The Kafka listener's counts since the broker started (as the tidewire_kafka_*
        metrics): where it listens, connections, bytes, and per API the requests by
        version, the errors by name and the latency."""
        return json_response(kafka_stats_doc(kafka_stats_of(broker)))

    return router
