"""The drain at a stop (SIGTERM, SIGINT, leaving an embedded broker): every listener of the
process stops at once, then the broker flushes and closes.

In order, with nothing awaited before step 2 is done:

1. every listener closes its listening socket (the binary protocol's, the HTTP API's, the
   compatibility modes', Kafka's): new connections are refused from this moment;
2. every wait ends: long-poll fetches (binary and HTTP) answer at once with what they have,
   push subscriptions, SSE and WebSocket streams end (WebSockets with 1001, going away),
   members waiting in a group join are told to join again; a Kafka connection reads no
   more requests and closes once those in flight are answered; a binary connection with nothing
   in flight gets a ``ShuttingDownError`` error frame and closes, an idle HTTP keep-alive
   connection closes;
3. the requests in flight finish, up to ``drain_timeout_s`` in all; a new request on a binary
   connection meanwhile is answered with ``ShuttingDownError`` (retriable: nothing of it was
   done), an HTTP connection closes after its answer (``Connection: close``);
4. what still runs then is cancelled and its connection closed;
5. the broker closes: every log is flushed and, only if every flush succeeded, the
   clean-shutdown marker is written (:meth:`~tidewire.storage.LogManager.close_async`).

Each step is logged at INFO; a routine stop logs no warning or error. A log that cannot be
flushed (a full disk) is reported once, naming the cause, and the marker is not written, so
the next start recovers.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidewire.broker import Broker
from tidewire.server.tcp import TcpServer

if TYPE_CHECKING:
    from tidewire.server.http.gateway import HttpGateway
    from tidewire.server.kafka.listener import KafkaServer

__all__ = ["DrainReport", "drain"]

log = logging.getLogger("tidewire")


@dataclass(frozen=True, slots=True)
class DrainReport:
    """What a drain did.

    Attributes:
        seconds: how long it took, up to the broker being closed.
        in_flight: requests running when it began (binary and HTTP).
        refused: binary requests answered with ``ShuttingDownError`` meanwhile.
        cut: requests still running at the end of the grace period (cancelled) and HTTP
            connections aborted then.
    """

    seconds: float
    in_flight: int
    refused: int
    cut: int


async def drain(
    broker: Broker,
    server: TcpServer | None,
    gateway: HttpGateway | None,
    *,
    grace_s: float,
    kafka: KafkaServer | None = None,
) -> DrainReport:
    """Drain the listeners and close the broker (see the module docstring).

    Args:
        broker: the broker, closed at the end.
        server: the binary-protocol listener, if any.
        gateway: the HTTP listeners, if any.
        kafka: the Kafka listener, if any (its connections stop reading requests and close
            once the requests in flight are answered).
        grace_s: how long requests in flight may take to finish (seconds).

    Raises:
        StorageError: a log could not be flushed (reported in the log already); the broker
            is closed all the same, without the clean-shutdown marker.
    """
    loop = asyncio.get_running_loop()
    began = loop.time()
    deadline = began + grace_s
    try:
        # 1 and 2: synchronous, so nothing is accepted or starts waiting in between.
        if server is not None:
            server.stop_accepting()
        if gateway is not None:
            gateway.stop_accepting()
        if kafka is not None:
            kafka.stop_accepting()
        broker.begin_drain()
        tcp_conns = len(server.connections) if server is not None else 0
        http_conns = gateway.connections() if gateway is not None else 0
        in_flight = (
            (server.in_flight() if server is not None else 0)
            + (gateway.in_flight() if gateway is not None else 0)
            + (kafka.in_flight() if kafka is not None else 0)
        )
        if server is not None:
            server.begin_drain()
        if gateway is not None:
            gateway.begin_drain()
        if kafka is not None:
            kafka.begin_drain()
        log.info(
            "draining: listeners closed; %d binary and %d HTTP connection(s), %d request(s) in "
            "flight, up to %g s for them",
            tcp_conns,
            http_conns,
            in_flight,
            grace_s,
        )
        # 3: every listener within the same grace period.
        waits = []
        if server is not None:
            waits.append(server.wait_in_flight(deadline))
        if gateway is not None:
            waits.append(gateway.wait_in_flight(deadline))
        if kafka is not None:
            waits.append(kafka.wait_in_flight(deadline))
        left = sum(await asyncio.gather(*waits))
        if left:
            log.warning(
                "%d request(s) still running after the %g s grace period: cancelling them",
                left,
                grace_s,
            )
        # 4
        cut = 0
        if gateway is not None:
            cut += await gateway.finish()
        if server is not None:
            cut += await server.finish()
        if kafka is not None:
            cut += await kafka.finish()
        refused = server.drain_refused if server is not None else 0
        log.info(
            "listeners drained in %.2f s: %d request(s) answered 'shutting down', %d cut",
            loop.time() - began,
            refused,
            cut,
        )
    finally:
        # 5: even when draining failed, so the logs are flushed.
        await broker.close()
    return DrainReport(loop.time() - began, in_flight, refused, cut)
