"""ENVELOPE (key 68) on one broker with authentication on: only a sender with
``cluster_action`` may send one; the inner request is checked as the principal it carries
(and refused as that principal), run as the HTTP owner, and answered; an envelope inside an
envelope, a queue consumer (it needs a connection) and an unknown API are refused.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.security.test_gate_binary import admin_key as admin_key_of
from tests.security.test_gate_binary import new_user, secured
from tidewire.client import AsyncClient, Credentials
from tidewire.client._transport import Transport
from tidewire.errors import AuthorizationFailedError, InvalidRequestError, UnknownDeliveryTagError
from tidewire.protocol.messages import (
    ApiKey,
    EnvelopeRequest,
    QueueConsumeRequest,
    QueueGetRequest,
    QueueGetResponse,
    QueueSettleRequest,
    encode_body,
)
from tidewire.server.envelope import ENVELOPE_OWNER, send_envelope


def test_an_envelope_runs_its_request_as_the_principal_it_carries(tmp_path: Path) -> None:
    async def main() -> None:
        async with secured(tmp_path) as (broker, _, addr):
            links: list[Transport] = []
            try:
                admin_key = admin_key_of(broker)
                async with AsyncClient(addr, credentials=Credentials(admin_key)) as c:
                    await c.declare_queue("q")
                    await c.publish("", "q", b"one")
                nobody_key = await new_user(broker, "nobody")
                admin = Transport(addr, credentials=Credentials(admin_key), request_timeout_s=30)
                nobody = Transport(addr, credentials=Credentials(nobody_key), request_timeout_s=30)
                links += [admin, nobody]
                get = QueueGetRequest(queue="q", max_messages=5)
                carried = {
                    "principal_kind": "user",
                    "client_source": "10.0.0.7:5",
                    "client_interface": "http",
                    "forwarded_by": 2,
                    "timeout_s": 30.0,
                }
                # The sender needs cluster_action, whatever it carries.
                with pytest.raises(AuthorizationFailedError, match="cluster"):
                    await send_envelope(nobody, get, principal="admin", **carried)  # type: ignore[arg-type]
                # The inner request is checked as the carried principal.
                with pytest.raises(AuthorizationFailedError, match=r"^nobody may not read queue:q"):
                    await send_envelope(admin, get, principal="nobody", **carried)  # type: ignore[arg-type]
                assert broker.queues.describe_queue("q").ready == 1  # nothing taken
                body, data = await send_envelope(admin, get, principal="admin", **carried)  # type: ignore[arg-type]
                assert isinstance(body, QueueGetResponse)
                (entry,) = body.entries
                assert len(data) > 0  # the record batch, as the envelope's data
                # Held by the HTTP owner, not by the connection: settled by that owner.
                await broker.queues.settle("q", [entry.tag], "ack", owner=ENVELOPE_OWNER)
                settle = QueueSettleRequest(queue="q", tags=[entry.tag])
                with pytest.raises(UnknownDeliveryTagError, match="not held"):
                    await send_envelope(admin, settle, principal="admin", **carried)  # type: ignore[arg-type]
                # Refused whatever the principal: an envelope inside one, a consumer, an
                # unknown API.
                inner = EnvelopeRequest(
                    request_api_key=int(ApiKey.QUEUE_GET),
                    request_body=encode_body(get),
                    principal="admin",
                )
                for key, raw in (
                    (int(ApiKey.ENVELOPE), encode_body(inner)),
                    (int(ApiKey.QUEUE_CONSUME), encode_body(QueueConsumeRequest(queue="q"))),
                    (999, b"\x80"),
                ):
                    response = await admin.request(
                        EnvelopeRequest(request_api_key=key, request_body=raw, principal="admin")
                    )
                    assert response is not None
                    assert response.body.error_code == InvalidRequestError.code, response.body
            finally:
                for link in links:
                    await link.close()

    asyncio.run(main())
