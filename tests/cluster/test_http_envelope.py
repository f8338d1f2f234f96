"""The queue routes of the HTTP API on a node that does not serve the queue (its owner is
another node; for declaring and deleting, another node leads ``__queue_definitions``):
forwarded in an ENVELOPE (key 68) carrying the caller, answered as the serving node answers
(``http_cluster_routing = "forward"``, the default), or ``307`` on a node set to
``redirect``; and, with authorization on, the serving node checking the carried principal:

- plain cluster: get, ack, nack, purge, dead letters browsed, replayed and purged, an
  exchange, a queue and a binding declared and deleted, all through nodes that do not serve
  them;
- secured cluster: a user whose API key may use a queue gets, acks, replays and purges it
  through a non-owner node; one without is refused 403 where it arrives; an ENVELOPE sent
  straight to the owner by a principal without ``cluster_action`` is refused, one from the
  node principal carrying a user without rights is refused by the owner's own check, and an
  envelope inside an envelope is refused.

In-process nodes against the real etcd of the ``etcd`` fixture; every wait is bounded,
nothing asserts on durations.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.cluster._etcd import EtcdServer
from tests.cluster._inprocess import WAIT_S, in_process_cluster, until
from tests.cluster._secure import NODE_PRINCIPAL, SecureNode, acl, secure_cluster
from tests.cluster.test_http_forwarding import HttpNode, declare_served, serving
from tidewire.broker.offsets import QUEUE_DEFINITIONS_TOPIC
from tidewire.client import AsyncClient, Credentials
from tidewire.client._transport import Transport
from tidewire.errors import AuthorizationFailedError, InvalidRequestError
from tidewire.protocol.messages import (
    ApiKey,
    EnvelopeRequest,
    QueueGetRequest,
    QueueGetResponse,
    QueuePurgeRequest,
    encode_body,
)
from tidewire.server.envelope import send_envelope


@asynccontextmanager
async def _link(addr: str, key: str) -> AsyncIterator[Transport]:
    """A binary protocol connection to ``addr`` authenticated with ``key``; closed after."""
    t = Transport(addr, credentials=Credentials(key), request_timeout_s=WAIT_S)
    try:
        yield t
    finally:
        await t.close()


async def until_async(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Until ``check()`` is true, asked every 0.1 s for at most ``WAIT_S``."""
    try:
        async with asyncio.timeout(WAIT_S):
            while not await check():
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"not within {WAIT_S:.0f} s: {what}") from None


def _definitions_leader(nodes: list[HttpNode] | list[SecureNode]) -> object:
    rep_leads = [
        n
        for n in nodes
        if not n.stopped
        and n.broker.replication is not None
        and n.broker.replication.leads(QUEUE_DEFINITIONS_TOPIC, 0)
    ]
    return rep_leads[0] if rep_leads else None


def test_queue_routes_on_a_node_that_does_not_serve_them_are_forwarded(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    async def main() -> None:
        make = lambda i: HttpNode(  # noqa: E731
            tmp_path, etcd, i, "http-env", routing="redirect" if i == 3 else "forward"
        )
        async with in_process_cluster(make, 3) as nodes:
            async with AsyncClient(nodes[0].addr) as c:
                await declare_served(c, nodes, "dead")
                await c.declare_queue(
                    "jobs", durable=True, dead_letter_exchange="", dead_letter_routing_key="dead"
                )
                await until(lambda: len(serving(nodes, "jobs")) == 1, "an owner serves jobs")
                for i in range(6):
                    await c.publish("", "jobs", f"m{i}")
            (owner,) = serving(nodes, "jobs")
            via = next(n for n in nodes if n is not owner and n.routing == "forward")
            async with httpx.AsyncClient(base_url=via.http, timeout=WAIT_S) as h:
                r = await h.post("/v1/queues/jobs/get", json={"max_messages": 3})
                assert r.status_code == 200, r.text
                got = r.json()["messages"]
                assert [m["value"] for m in got] == ["m0", "m1", "m2"]
                # Held by the HTTP owner on the owner node: settled through any node.
                assert owner.broker.queues.describe_queue("jobs").unacked == 3
                r = await h.post("/v1/queues/jobs/ack", json={"tags": [got[0]["tag"]]})
                assert r.status_code == 200, r.text
                r = await h.post("/v1/queues/jobs/nack", json={"tags": [got[1]["tag"]]})
                assert r.status_code == 200, r.text
                r = await h.post("/v1/queues/jobs/reject", json={"tags": [got[2]["tag"]]})
                assert r.status_code == 200, r.text  # dead-lettered to "dead"
                r = await h.post("/v1/queues/jobs/ack", json={"tags": [got[0]["tag"]]})
                assert r.status_code == 409, r.text  # not held any more: the owner's answer
                status = owner.broker.queues.describe_queue("jobs")
                assert (status.ready, status.unacked) == (4, 0)  # m1 requeued, m3..m5
                r = await h.post("/v1/queues/jobs/purge")
                assert r.status_code == 200, r.text
                assert r.json() == {"queue": "jobs", "messages": 4}
                r = await h.post("/v1/queues/nowhere/purge")
                assert r.status_code == 404, r.text
                # A publish through the default exchange, routed to the owner by this node.
                body = {"routing_key": "jobs", "messages": [{"value": "p0"}]}
                r = await h.post("/v1/exchanges/amq.default/publish", json=body)
                assert r.status_code == 200, r.text
                r = await h.post("/v1/queues/jobs/get", json={"max_messages": 5})
                assert [m["value"] for m in r.json()["messages"]] == ["p0"], r.text
                r = await h.post(
                    "/v1/queues/jobs/ack", json={"up_to": r.json()["messages"][0]["tag"]}
                )
                assert r.status_code == 200, r.text

            # The dead letter, on the owner of "dead", through another node.
            (dead_owner,) = serving(nodes, "dead")
            await until(
                lambda: dead_owner.broker.queues.describe_queue("dead").ready == 1,
                "the rejected message dead-lettered",
            )
            via = next(n for n in nodes if n is not dead_owner and n.routing == "forward")
            async with httpx.AsyncClient(base_url=via.http, timeout=WAIT_S) as h:
                r = await h.get("/v1/queues/dead/dlq")
                assert r.status_code == 200, r.text
                (letter,) = r.json()["messages"]
                assert letter["value"] == "m2"
                r = await h.post("/v1/queues/dead/dlq/replay", json={"all": True})
                assert r.status_code == 200, r.text
                assert r.json()["messages"] == 1
                r = await h.post("/v1/queues/dead/dlq/purge")
                assert r.status_code == 200, r.text
            await until(
                lambda: owner.broker.queues.describe_queue("jobs").ready == 1,
                "the dead letter replayed to jobs",
            )

            # Definitions through a node that does not lead __queue_definitions.
            leader = _definitions_leader(nodes)
            assert leader is not None
            via = next(n for n in nodes if n is not leader and n.routing == "forward")
            async with httpx.AsyncClient(base_url=via.http, timeout=WAIT_S) as h:
                r = await h.put("/v1/exchanges/events", json={"type": "fanout"})
                assert r.status_code == 201, r.text
                r = await h.put("/v1/queues/audit", json={"max_length": 10})
                assert r.status_code == 201, r.text
                assert r.json()["max_length"] == 10
                r = await h.put("/v1/queues/audit", json={"max_length": 11})
                assert r.status_code == 409, r.text  # the leader's answer
                binding = {"exchange": "events", "destination": "audit"}
                r = await h.post("/v1/bindings", json=binding)
                assert r.status_code == 201, r.text
                r = await h.request("DELETE", "/v1/bindings", json=binding)
                assert r.status_code == 204, r.text
                r = await h.delete("/v1/exchanges/events")
                assert r.status_code == 204, r.text
                r = await h.delete("/v1/queues/audit")
                assert r.status_code == 200, r.text
            assert "audit" not in {q.spec.name for q in leader.broker.queues.queues()}  # type: ignore[attr-defined]

            # A node set to redirect answers 307 to the owner instead.
            (redirecting,) = (n for n in nodes if n.routing == "redirect")
            async with httpx.AsyncClient(base_url=redirecting.http, timeout=WAIT_S) as h:
                for queue in ("jobs", "dead"):
                    (served_by,) = serving(nodes, queue)
                    if served_by is redirecting:
                        continue
                    r = await h.post(f"/v1/queues/{queue}/purge")
                    assert r.status_code == 307, r.text
                    assert r.headers["location"] == f"{served_by.http}/v1/queues/{queue}/purge"

    asyncio.run(asyncio.wait_for(main(), 120))


def test_a_secured_cluster_forwards_queue_requests_as_the_caller(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """Authorization on, the node principal with the role ``node`` (no queue permissions of
    its own): a user's API key gets, acks, replays and purges through a non-owner node; a
    user without rights is refused 403 where the request arrives; and the owner checks the
    principal an ENVELOPE carries, not its sender. About 10 s."""

    async def main() -> None:
        async with secure_cluster(tmp_path, etcd, "sec-env") as c:
            keys: dict[str, str] = {}
            async with c.nodes[0].client(c.admin) as admin:
                await admin.alter_principal(NODE_PRINCIPAL, roles=["node"])
                for name in ("worker", "idle"):
                    await admin.create_principal(name)
                    _, keys[name] = await admin.create_api_key(name)
                await admin.add_acls(
                    [
                        *acl("worker", "queue", "jobs", "read", "delete", "describe"),
                        *acl("worker", "queue", "*", "write"),
                        *acl("idle", "queue", "jobs", "describe"),
                    ]
                )
                await admin.declare_queue("jobs", durable=True)
                await until(lambda: len(serving(c.nodes, "jobs")) == 1, "an owner serves jobs")
                for i in range(4):
                    await admin.publish("", "jobs", f"m{i}")
            await c.settled()
            (owner,) = serving(c.nodes, "jobs")
            via = next(n for n in c.nodes if n is not owner)
            async with via.http(keys["idle"]) as http:
                r = await http.post("/v1/queues/jobs/get", json={"max_messages": 1})
                assert r.status_code == 403, r.text
                r = await http.post("/v1/queues/jobs/purge")
                assert r.status_code == 403, r.text
            async with via.http(keys["worker"]) as http:
                r = await http.post("/v1/queues/jobs/get", json={"max_messages": 2})
                assert r.status_code == 200, r.text
                got = r.json()["messages"]
                assert [m["value"] for m in got] == ["m0", "m1"]
                r = await http.post("/v1/queues/jobs/ack", json={"tags": [got[0]["tag"]]})
                assert r.status_code == 200, r.text
                r = await http.post("/v1/queues/jobs/dlq/replay", json={"all": True})
                assert r.status_code == 200, r.text  # nothing dead-lettered: none moved
                assert r.json()["messages"] == 0
                r = await http.post("/v1/queues/jobs/purge")
                assert r.status_code == 200, r.text
                assert r.json()["messages"] == 2  # m2, m3 (m1 is held, not ready)
            assert owner.broker.queues.describe_queue("jobs").unacked == 1

            # Straight to the owner: the envelope needs cluster_action of its sender...
            get = QueueGetRequest(queue="jobs", max_messages=1)
            wrapped = {
                "principal_kind": "user",
                "client_source": "127.0.0.1:1",
                "client_interface": "http",
                "forwarded_by": via.id,
                "timeout_s": WAIT_S,
            }
            async with _link(owner.addr, keys["worker"]) as t:
                with pytest.raises(AuthorizationFailedError, match="cluster"):
                    await send_envelope(t, get, principal="worker", **wrapped)  # type: ignore[arg-type]
            assert c.node_key is not None
            async with _link(owner.addr, c.node_key) as t:
                # ...and the owner checks the principal it carries, not the node's rights.
                with pytest.raises(
                    AuthorizationFailedError, match=r"^idle may not delete queue:jobs"
                ):
                    await send_envelope(
                        t,
                        QueuePurgeRequest(name="jobs"),
                        principal="idle",
                        **wrapped,  # type: ignore[arg-type]
                    )
                # Audited by the owner as the carried principal, forwarded by the sender.
                async with owner.client(c.admin) as admin:
                    denied: list[Any] = []

                    async def audited() -> bool:
                        denied[:] = await admin.describe_audit(
                            principal="idle", action="QUEUE_PURGE", outcome="denied"
                        )
                        return bool(denied)

                    await until_async(audited, "the refused envelope audited")
                assert denied[-1].resource == "queue:jobs"
                assert denied[-1].interface == f"http (forwarded by node {via.id})"
                assert denied[-1].source == "127.0.0.1:1"
                body, _ = await send_envelope(t, get, principal="worker", **wrapped)  # type: ignore[arg-type]
                assert isinstance(body, QueueGetResponse)
                assert body.entries == []  # m1 is held; nothing ready
                # No envelope in an envelope.
                inner = EnvelopeRequest(
                    request_api_key=int(ApiKey.QUEUE_GET),
                    request_body=encode_body(get),
                    principal="worker",
                )
                outer = EnvelopeRequest(
                    request_api_key=int(ApiKey.ENVELOPE),
                    request_body=encode_body(inner),
                    principal="worker",
                )
                response = await t.request(outer, timeout_s=WAIT_S)
                assert response is not None
                assert response.body.error_code == InvalidRequestError.code
                assert "cannot carry an ENVELOPE" in response.body.error_message

    asyncio.run(asyncio.wait_for(main(), 120))
