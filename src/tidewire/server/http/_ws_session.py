"""One WebSocket stream of a topic: its credit, its group membership, and the tasks that
serve it (see :mod:`tidewire.server.http.stream` for the protocol).

- *delivery* reads the log through a :class:`~._cursor.LogCursor` and sends messages while
  the client's credit lasts; caught up, it waits on the broker's append wake-ups, and out of
  credit, on the next grant;
- *commands* reads the client's JSON commands (credit, commit);
- *membership* (with ``group``) keeps the member's session alive and, when the group
  rebalances, pauses delivery, joins again and resumes with the new assignment (partitions
  it keeps go on from where they were; new ones from the group's committed offsets).

Whichever task ends first (the client went away, a bad command, a failed read) ends the
others; a member leaves its group when the socket closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.websockets import WebSocket, WebSocketDisconnect

from tidewire._tasks import cancel_and_wait
from tidewire.broker import Broker
from tidewire.errors import (
    ConnectionLostError,
    GroupFullError,
    IllegalGenerationError,
    InconsistentGroupProtocolError,
    InvalidRequestError,
    NotCoordinatorError,
    OffsetOutOfRangeError,
    RebalanceInProgressError,
    RequestTimedOutError,
    TidewireError,
    UnknownMemberError,
    UnknownPartitionError,
    UnknownTopicError,
)
from tidewire.server.http._cursor import StartAt
from tidewire.server.http._params import error_frame, partitions_param, wait_for_data_or
from tidewire.server.http._ws_group import GroupLink
from tidewire.server.http._ws_settings import (
    CLOSE_CODES,
    HEARTBEAT_S,
    MAX_COMMAND_BYTES,
    MAX_CREDIT_BYTES,
    MAX_CREDIT_MESSAGES,
    MAX_FRAME_BYTES,
    RECHECK_S,
    ROUND_BYTES,
    WsSettings,
)
from tidewire.server.http.peers import (
    ClusterCursor,
    close_cursor,
    make_cursor,
    resolve_start,
    wake_events,
)

__all__ = ["SocketIO", "WsSession", "close_reason"]

log = logging.getLogger("tidewire.http")

#: What leaving a group on another node may fail with besides not being a member: the member
#: is then removed when its session runs out.
_LEAVING = (NotCoordinatorError, ConnectionLostError, RequestTimedOutError)


class _Close(Exception):
    """End the session with a close frame (after an error frame, when ``error`` is set)."""

    def __init__(self, code: int, error: TidewireError | None = None) -> None:
        super().__init__(code)
        self.code = code
        self.error = error


def close_reason(error: TidewireError | None) -> str:
    """A close frame's reason for ``error``: its message, cut to 120 bytes (a close frame's
    reason is 123 at most) at a character boundary; empty without an error."""
    return "" if error is None else error.message.encode()[:120].decode("utf-8", "ignore")


class SocketIO:
    """What every WebSocket served by several tasks does alike (a topic stream and a queue
    subscription, here or fed from another node): send under one lock, run its tasks until
    the first ends, then stop them and close with the code that ended it.

    The class sets ``ws``, ``closing`` (the gateway draining) and ``_send_lock``.
    """

    ws: WebSocket
    closing: asyncio.Event
    _send_lock: asyncio.Lock

    async def _serve(
        self,
        start: Callable[[], Awaitable[list[asyncio.Task[None]]]],
        stop: Callable[[], Awaitable[None]],
        close_for: Callable[[TidewireError], _Close] | None = None,
    ) -> None:
        """Serve the socket until either side ends it.

        Args:
            start: begin the session (a ``_Close`` it raises closes the socket) and start its
                tasks; whichever ends first ends the others.
            stop: release what the session holds, once its tasks have stopped.
            close_for: the close a :class:`TidewireError` calls for; without it such an
                error is raised (after ``stop``).
        """
        tasks: list[asyncio.Task[None]] = []
        close: _Close | None = None
        try:
            try:
                tasks = await start()
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    t.result()  # raises what ended it
            except _Close as exc:
                close = exc
            except _Gone:
                pass
            except TidewireError as exc:
                if close_for is None:
                    raise
                close = close_for(exc)
        finally:
            # The tasks stop before the close frame, so nothing is sent after it.
            for t in tasks:
                await cancel_and_wait(t, ignore=(_Close, _Gone, TidewireError))
            await stop()
        if close is not None:
            await self._close(close)

    async def _close(self, close: _Close) -> None:
        try:
            if close.error is not None:
                await self._send_obj(error_frame(close.error))
            await self.ws.close(close.code, close_reason(close.error))
        except (_Gone, WebSocketDisconnect, OSError, RuntimeError):
            pass  # the client is gone already

    async def _drain(self) -> None:
        await self.closing.wait()
        raise _Close(CLOSE_CODES["going_away"], None)

    async def _send_text(self, text: str) -> None:
        async with self._send_lock:
            try:
                await self.ws.send_text(text)
            except (WebSocketDisconnect, OSError, RuntimeError):
                raise _Gone from None

    async def _send_obj(self, obj: Any) -> None:
        await self._send_text(msgspec.json.encode(obj).decode())


class WsSession(SocketIO):
    """Serve one accepted WebSocket until either side ends it."""

    def __init__(
        self,
        broker: Broker,
        ws: WebSocket,
        topic: str,
        settings: WsSettings,
        closing: asyncio.Event | None = None,
    ) -> None:
        self.broker = broker
        self.closing = closing or asyncio.Event()
        self.ws = ws
        self.topic = topic
        self.s = settings
        # In a cluster, partitions held elsewhere are fetched from their leaders (peers.py).
        self.cursor = make_cursor(broker, topic, force_base64=settings.force_base64)
        # Its group's coordinator, here or (in a cluster) on another node.
        peer = self.cursor.peer if isinstance(self.cursor, ClusterCursor) else None
        self.group = GroupLink(broker, settings.group, peer)
        self.credit = settings.credit
        self.credit_bytes = settings.credit_bytes
        self.window_bytes = settings.credit_bytes
        self.changed = asyncio.Event()  # credit granted, or the assignment changed
        self.rebalancing = False
        self.member_id = ""
        self.generation = -1
        self.sent = 0  # messages sent (for tests and benchmarks)
        self._send_lock = asyncio.Lock()

    # --- the session ----------------------------------------------------------------------------

    async def run(self) -> None:
        await self._serve(self._tasks, self._stop)

    async def _tasks(self) -> list[asyncio.Task[None]]:
        await self._start()
        tasks = [
            asyncio.create_task(self._commands(), name="ws commands"),
            asyncio.create_task(self._deliver(), name="ws delivery"),
        ]
        if self.s.group:
            tasks.append(asyncio.create_task(self._membership(), name="ws membership"))
        tasks.append(asyncio.create_task(self._drain(), name="ws drain"))
        return tasks

    async def _stop(self) -> None:
        if self.s.group and self.member_id:
            with contextlib.suppress(UnknownMemberError, InvalidRequestError, *_LEAVING):
                await self.group.leave(self.member_id)
        await self.group.close()
        await close_cursor(self.cursor)

    async def _start(self) -> None:
        try:
            if self.s.group:
                await self._join()
            else:
                parts = partitions_param(self.broker, self.topic, self.s.partitions)
                self.cursor.assign(
                    {p: await resolve_start(self.cursor, self.s.start, p) for p in parts}
                )
        except (UnknownTopicError, UnknownPartitionError) as exc:
            raise _Close(CLOSE_CODES["not_found"], exc) from None
        except (GroupFullError, InconsistentGroupProtocolError) as exc:
            raise _Close(CLOSE_CODES["conflict"], exc) from None
        except TidewireError as exc:
            raise _Close(CLOSE_CODES["bad_request"], exc) from None
        await self._send_obj(
            {
                "type": "subscribed",
                "topic": self.topic,
                "group": self.s.group or None,
                "member_id": self.member_id or None,
                "generation": self.generation,
                "partitions": self._partition_list(),
                "credit": {"messages": self.credit, "bytes": self.credit_bytes},
                "batch": self.s.batch,
            }
        )

    def _partition_list(self) -> list[dict[str, int]]:
        return [{"partition": p, "offset": off} for p, off in self.cursor.positions()]

    # --- delivery -------------------------------------------------------------------------------

    async def _deliver(self) -> None:
        rotate = 0
        while True:
            if self.rebalancing or self.credit <= 0 or self.credit_bytes <= 0:
                self.changed.clear()
                if self.rebalancing or self.credit <= 0 or self.credit_bytes <= 0:
                    await self.changed.wait()
                continue
            self.changed.clear()
            parts = list(self.cursor.parts.values())
            if not parts:
                await self.changed.wait()
                continue
            rotate = (rotate + 1) % len(parts)
            frames, blocked, failed = self._take(parts[rotate:] + parts[:rotate])
            for frame in frames:  # what was taken before a failed read goes out first
                await self._send_text(frame)
            if failed is not None:
                raise failed
            if frames:
                continue
            if blocked:
                await self.changed.wait()
            else:
                await self._wait_for_data()

    def _take(self, parts: list[Any]) -> tuple[list[str], bool, _Close | None]:
        """Messages to send now, within the credit, grouped into frames; whether the byte
        credit stopped it; and the close a failed read calls for."""
        batch = self.s.batch
        frames: list[str] = []
        current: list[bytes] = []
        current_bytes = total = 0
        blocked = False
        failed: _Close | None = None
        try:
            for part in parts:
                while self.credit > 0 and total < ROUND_BYTES:
                    head = self.cursor.peek(part)
                    if head is None:
                        break
                    size = len(head[1])
                    if size > self.credit_bytes and self.credit_bytes < self.window_bytes:
                        blocked = True
                        break
                    self.cursor.advance(part)
                    self.credit -= 1
                    self.sent += 1
                    self.credit_bytes -= size
                    total += size
                    if batch == 1:
                        frames.append(head[1].decode())
                        continue
                    if current and (
                        len(current) >= batch or current_bytes + size > MAX_FRAME_BYTES
                    ):
                        frames.append(_array(current))
                        current, current_bytes = [], 0
                    current.append(head[1])
                    current_bytes += size
                if blocked or self.credit_bytes <= 0:
                    break
        except OffsetOutOfRangeError as exc:
            failed = _Close(CLOSE_CODES["out_of_range"], exc)
        except (UnknownTopicError, UnknownPartitionError) as exc:
            failed = _Close(CLOSE_CODES["not_found"], exc)
        except TidewireError as exc:
            failed = _Close(CLOSE_CODES["internal"], exc)
        if current:
            frames.append(_array(current))
        return frames, blocked, failed

    async def _wait_for_data(self) -> None:
        await wait_for_data_or(
            self.broker,
            self.cursor.waiting_keys(),
            RECHECK_S,
            self.changed,
            *wake_events(self.cursor),
        )

    # --- commands -------------------------------------------------------------------------------

    async def _commands(self) -> None:
        while True:
            cmd = await receive_command(self.ws)
            kind = cmd.get("type") if isinstance(cmd, dict) else None
            if kind == "credit":
                self._grant(cmd)
            elif kind == "commit":
                await self._commit(cmd)
            else:
                raise _Close(
                    CLOSE_CODES["policy"],
                    InvalidRequestError(
                        f"unknown command {kind!r}: commands are {{'type': 'credit'}} and "
                        "{'type': 'commit'}"
                    ),
                )

    def _grant(self, cmd: dict[str, Any]) -> None:
        messages, nbytes = cmd.get("messages", 0), cmd.get("bytes", 0)
        for name, value in (("messages", messages), ("bytes", nbytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise _Close(
                    CLOSE_CODES["policy"],
                    InvalidRequestError(f"credit {name}={value!r} must be an integer >= 0"),
                )
        if messages == 0 and nbytes == 0:
            raise _Close(
                CLOSE_CODES["policy"],
                InvalidRequestError("a credit command grants messages or bytes"),
            )
        extra = set(cmd) - {"type", "messages", "bytes"}
        if extra:
            raise _Close(
                CLOSE_CODES["policy"],
                InvalidRequestError(f"credit has unknown field(s) {sorted(extra)}"),
            )
        if (
            self.credit + messages > MAX_CREDIT_MESSAGES
            or self.credit_bytes + nbytes > MAX_CREDIT_BYTES
        ):
            raise _Close(
                CLOSE_CODES["policy"],
                InvalidRequestError(
                    f"credit over {MAX_CREDIT_MESSAGES:,} messages or {MAX_CREDIT_BYTES:,} bytes"
                ),
            )
        self.credit += messages
        self.credit_bytes += nbytes
        self.changed.set()

    async def _commit(self, cmd: dict[str, Any]) -> None:
        if not self.s.group:
            raise _Close(
                CLOSE_CODES["policy"],
                InvalidRequestError("commit needs a stream opened with ?group="),
            )
        extra = set(cmd) - {"type", "offsets"}
        if extra:
            raise _Close(
                CLOSE_CODES["policy"],
                InvalidRequestError(f"commit has unknown field(s) {sorted(extra)}"),
            )
        offsets = self._commit_offsets(cmd.get("offsets"))
        if not offsets:
            await self._send_obj({"type": "committed", "offsets": []})
            return
        try:
            await self.group.commit(
                {(self.topic, p): off for p, off in offsets.items()},
                member_id=self.member_id,
                generation=self.generation,
            )
        except TidewireError as exc:  # fenced by a rebalance, a storage failure: not fatal
            err = error_frame(exc)
            err["command"] = "commit"
            await self._send_obj(err)
            return
        await self._send_obj(
            {
                "type": "committed",
                "offsets": [{"partition": p, "offset": o} for p, o in sorted(offsets.items())],
            }
        )

    def _commit_offsets(self, given: Any) -> dict[int, int]:
        if given is None:
            return dict(self.cursor.positions())
        bad = InvalidRequestError(
            "commit offsets must be a list of {'partition': P, 'offset': O} with integers >= 0"
        )
        if not isinstance(given, list):
            raise _Close(CLOSE_CODES["policy"], bad)
        out: dict[int, int] = {}
        for item in given:
            if not isinstance(item, dict) or set(item) != {"partition", "offset"}:
                raise _Close(CLOSE_CODES["policy"], bad)
            p, off = item["partition"], item["offset"]
            if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in (p, off)):
                raise _Close(CLOSE_CODES["policy"], bad)
            out[p] = off
        return out

    # --- group membership -----------------------------------------------------------------------

    async def _join(self) -> None:
        self.member_id, self.generation, assignment = await self.group.join(
            member_id=self.member_id,
            client_id="http-websocket",
            topics=[self.topic],
            session_timeout_ms=self.s.session_timeout_ms,
            rebalance_timeout_ms=max(self.s.session_timeout_ms, 1_000),
        )
        mine = [p for t, p in assignment if t == self.topic]
        committed = await self.group.committed([(self.topic, p) for p in mine])
        positions: dict[int, int] = {}
        for p in mine:
            if p in self.cursor.parts:
                positions[p] = self.cursor.parts[p].position
                continue
            c = committed.get((self.topic, p))
            if c is None:
                positions[p] = await resolve_start(self.cursor, self.s.start, p)
            else:
                start = await resolve_start(self.cursor, StartAt("earliest"), p)
                positions[p] = max(c, start)
        self.cursor.assign(positions)

    async def _membership(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            try:
                await self.group.heartbeat(self.member_id, self.generation)
                continue
            except RebalanceInProgressError:
                pass
            except (UnknownMemberError, IllegalGenerationError, NotCoordinatorError):
                # Removed (a session that ran out), or its coordinator moved (a new one may
                # not know the member): join as a new member.
                self.member_id = ""
            self.rebalancing = True
            self.changed.set()
            try:
                await self._join()
            except (GroupFullError, InconsistentGroupProtocolError) as exc:
                raise _Close(CLOSE_CODES["conflict"], exc) from None
            except RebalanceInProgressError:
                continue  # replaced by a newer join or the broker is stopping: try again
            except (UnknownMemberError, NotCoordinatorError):
                self.member_id = ""
                continue
            await self._send_obj(
                {
                    "type": "assigned",
                    "generation": self.generation,
                    "partitions": self._partition_list(),
                }
            )
            self.rebalancing = False
            self.changed.set()


class _Gone(Exception):
    """The client went away."""


async def receive_command(ws: WebSocket) -> Any:
    """The next command a client sends: a JSON text frame of at most
    :data:`MAX_COMMAND_BYTES`, parsed (a topic stream's and a queue subscription's alike).

    Raises:
        _Gone: the client went away.
        _Close: not text, too large, or not JSON (with the close code that says which).
    """
    msg = await ws.receive()
    if msg["type"] == "websocket.disconnect":
        raise _Gone
    text = msg.get("text")
    if text is None:
        raise _Close(
            CLOSE_CODES["unsupported_data"],
            InvalidRequestError("commands are JSON text frames"),
        )
    if len(text) > MAX_COMMAND_BYTES:
        raise _Close(
            CLOSE_CODES["too_big"],
            InvalidRequestError(
                f"a command of {len(text):,} characters exceeds {MAX_COMMAND_BYTES:,}"
            ),
        )
    try:
        return json.loads(text)
    except ValueError as exc:
        raise _Close(
            CLOSE_CODES["invalid_payload"],
            InvalidRequestError(f"a command is not JSON: {exc}"),
        ) from None


def _array(items: list[bytes]) -> str:
    return (b"[" + b",".join(items) + b"]").decode()
