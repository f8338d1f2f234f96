"""The SASL exchange of the Kafka listener through the gate: SaslHandshake (v0: the tokens
then come raw, each framed by its size alone; v1: as SaslAuthenticate requests) and
SaslAuthenticate. The mechanisms are the binary protocol's (PLAIN, SCRAM-SHA-256/512 with
API keys: the username a key's id, the password its secret; PLAIN also takes the whole key
as password), checked, rate-limited and audited by the gate (docs/security.md).
"""

from __future__ import annotations

import logging
from typing import Any

from tidewire.errors import AuthenticationFailedError, TidewireError
from tidewire.observability.kafka_metrics import kafka_stats_for
from tidewire.protocol.kafka import ErrorCode
from tidewire.server.kafka.context import KafkaContext
from tidewire.server.kafka.errors import error_code

__all__ = [
    "CLOSE_AFTER",
    "RAW_SASL",
    "plain_message",
    "sasl_authenticate",
    "sasl_handshake",
    "sasl_step",
]

log = logging.getLogger("tidewire.kafka")

#: ``session.extra`` keys the listener reads after a SASL answer: the client continues
#: with raw SASL tokens (SaslHandshake v0), or the connection closes (a failed exchange).
RAW_SASL = "kafka_raw_sasl"
CLOSE_AFTER = "kafka_close_after"


async def sasl_handshake(ctx: KafkaContext, version: int, body: dict[str, Any]) -> dict[str, Any]:
    gate, session = ctx.gate, ctx.session
    if session.authenticated:
        # The broker answers session_lifetime_ms 0, so clients never re-authenticate
        # (KIP-368); a second exchange could only be an attempt to change principal.
        return {"error_code": ErrorCode.ILLEGAL_SASL_STATE, "mechanisms": []}
    try:
        offered = gate.sasl_start(session, body["mechanism"])
    except TidewireError as exc:
        await gate.hold_back(exc)
        log.info("SASL handshake refused for %s: %s", session.source, exc.message)
        return {"error_code": error_code(exc), "mechanisms": gate.mechanisms(session)}
    # v0: the tokens follow framed by a size alone, not as SaslAuthenticate requests.
    session.extra[RAW_SASL] = version == 0
    return {"error_code": ErrorCode.NONE, "mechanisms": offered}


def plain_message(data: bytes) -> bytes:
    """A PLAIN message as the gate reads it (its password the whole API key): Kafka clients
    may also give the key's id as username and its secret as password, as for SCRAM."""
    parts = data.split(b"\0")
    if len(parts) == 3 and parts[1] and parts[2] and not parts[2].startswith(b"twk_"):
        return b"\0".join((parts[0], parts[1], b"twk_" + parts[1] + b"_" + parts[2]))
    return data


async def sasl_step(ctx: KafkaContext, data: bytes) -> tuple[bytes, bool]:
    """One SASL token through the gate (PLAIN's rewritten by :func:`plain_message`).

    Raises:
        TidewireError: the exchange failed (audited; answered after the gate's delay).
    """
    session = ctx.session
    mechanism = session.sasl_mechanism
    if mechanism == "PLAIN":
        data = plain_message(data)
    stats = kafka_stats_for(ctx.broker)
    try:
        reply, complete = await ctx.gate.sasl_step(session, data)
    except TidewireError as exc:
        stats.authentication(False, mechanism)
        await ctx.gate.hold_back(exc)
        raise
    if complete:
        stats.authentication(True, mechanism)
    return reply, complete


async def sasl_authenticate(
    ctx: KafkaContext, version: int, body: dict[str, Any]
) -> dict[str, Any]:
    try:
        reply, _ = await sasl_step(ctx, bytes(body["auth_bytes"]))
    except TidewireError as exc:
        ctx.session.extra[CLOSE_AFTER] = True  # as Kafka: a failed exchange ends the connection
        message = exc.message
        if not isinstance(exc, AuthenticationFailedError):
            message = f"authentication failed: {message}"
        return {
            "error_code": error_code(exc),
            "error_message": message,
            "auth_bytes": b"",
            "session_lifetime_ms": 0,
        }
    return {
        "error_code": ErrorCode.NONE,
        "error_message": None,
        "auth_bytes": reply,
        "session_lifetime_ms": 0,
    }
