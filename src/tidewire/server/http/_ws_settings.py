"""The settings of a WebSocket stream (its query string), its bounds, and its close codes
(see :mod:`tidewire.server.http.stream` for the protocol)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tidewire.errors import InvalidRequestError
from tidewire.server.http._cursor import StartAt, parse_from
from tidewire.server.http._params import encoding_param, int_param

__all__ = ["CLOSE_CODES", "MAX_COMMAND_BYTES", "WsSettings"]

#: The longest command frame a client may send: a commit of 1,000 partitions fits.
MAX_COMMAND_BYTES = 64 * 1024
#: The most credit a client may hold at once (messages, bytes): a bound on what one grant
#: can make the server send without another word from the client.
MAX_CREDIT_MESSAGES = 1_000_000_000
MAX_CREDIT_BYTES = 1 << 40
#: Messages per frame at most when the client asks for arrays (``batch``).
MAX_BATCH = 1_000
#: The most data one frame carries unless a single message is larger.
MAX_FRAME_BYTES = 1024 * 1024
#: Bytes sent per round of the delivery loop before it lets the loop's other work run.
ROUND_BYTES = 1024 * 1024
#: How long a caught-up stream waits for an append before it reads again anyway (a wake-up
#: missed for a partition added meanwhile is picked up then).
RECHECK_S = 1.0
#: How often a group member's session is refreshed, and so how late it notices a rebalance.
HEARTBEAT_S = 0.25

#: WebSocket close codes (RFC 6455 and the application range 4000-4999).
CLOSE_CODES = {
    "normal": 1000,
    "going_away": 1001,
    "unsupported_data": 1003,  # a binary frame: commands are JSON text
    "invalid_payload": 1007,  # a text frame that is not JSON
    "policy": 1008,  # a command that is not one this endpoint knows, or bad fields
    "too_big": 1009,  # a command frame over MAX_COMMAND_BYTES
    "internal": 1011,
    "bad_request": 4400,  # a bad query parameter
    "not_found": 4404,  # unknown topic or partition
    "conflict": 4409,  # the group refused this member (group full, other strategy)
    "out_of_range": 4416,  # the position is no longer in the log (retention)
}


@dataclass(frozen=True, slots=True)
class WsSettings:
    """What the client asked for in the query string."""

    group: str
    start: StartAt
    partitions: str
    credit: int
    credit_bytes: int
    batch: int
    force_base64: bool
    session_timeout_ms: int

    @classmethod
    def from_params(cls, params: Any) -> WsSettings:
        """Read and check the query parameters.

        Raises:
            InvalidRequestError: a bad parameter (the message names it).
        """
        group = params.get("group") or ""
        start = parse_from(params.get("from"))
        if group and start.kind not in ("earliest", "latest"):
            raise InvalidRequestError(
                f"with a group, from= says where partitions without a committed offset start: "
                f"earliest or latest, not {start.kind}"
            )
        if group and params.get("partitions"):
            raise InvalidRequestError("partitions= is not allowed with a group: it assigns them")
        return cls(
            group=group,
            start=start,
            partitions=params.get("partitions") or "",
            credit=int_param(params, "credit", 1_000, 0, MAX_CREDIT_MESSAGES),
            credit_bytes=int_param(params, "credit_bytes", 1 << 20, 1, MAX_CREDIT_BYTES),
            batch=int_param(params, "batch", 1, 1, MAX_BATCH),
            force_base64=encoding_param(params),
            session_timeout_ms=int_param(params, "session_timeout_ms", 10_000, 1, 300_000),
        )
