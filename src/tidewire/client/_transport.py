"""The client side of one TCP connection: requests out, responses matched back to their
callers by correlation id, over a sans-IO :class:`~tidewire.protocol.Connection`.

One reader task per connection hands each response to the future of the request that asked
for it. Requests wait for a free in-flight slot rather than fail, every request has a timeout,
and a broken connection fails every request waiting on it with a retriable error; the next
request opens a new connection, after a backoff that doubles up to a cap.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence

from tidewire._tasks import cancel_and_wait
from tidewire.errors import (
    ConnectionLostError,
    ProtocolError,
    RequestTimedOutError,
    TidewireError,
)
from tidewire.protocol import (
    NEED_DATA,
    Connection,
    ConnectionClosed,
    PushReceived,
    ResponseReceived,
    Role,
)
from tidewire.protocol.frames import DEFAULT_MAX_FRAME_BYTES, Buffer
from tidewire.protocol.messages import (
    Body,
    FetchResponse,
    ProduceResponse,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
)
from tidewire.security.credentials import Credentials
from tidewire.security.scram import ScramClient
from tidewire.security.tls import TlsError, TlsOptions

__all__ = ["Transport", "parse_addr"]

log = logging.getLogger("tidewire.client")

#: Bytes read from the socket at a time.
READ_CHUNK = 256 * 1024
#: First and largest pause before reconnecting after a failure (seconds).
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 5.0
#: How long :meth:`Transport.close` waits for the connection to close (seconds): a TLS
#: connection exchanges close_notify first; a broker that does not answer is not waited for.
CLOSE_TIMEOUT_S = 1.0


#: What an OpenSSL failure reason most often means, added to the error's message.
_TLS_HINTS = {
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": " (the broker requires a client certificate)",
    "SSLV3_ALERT_BAD_CERTIFICATE": " (the broker refused the client certificate)",
    "TLSV1_ALERT_UNKNOWN_CA": " (the broker does not trust the client certificate's CA)",
    "WRONG_VERSION_NUMBER": " (is the broker's port plaintext?)",
    "TLSV1_ALERT_PROTOCOL_VERSION": " (no TLS version in common: see min_version)",
    "UNSUPPORTED_PROTOCOL": " (no TLS version in common: see min_version)",
}


def parse_addr(addr: str) -> tuple[str, int]:
    """``"HOST:PORT"`` -> ``(host, port)``.

    Raises:
        ValueError: not of that form.
    """
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"address {addr!r} must be HOST:PORT with a port in 1..65535")
    return host.strip("[]"), int(port)


class Transport:
    """A connection to one broker, opened on first use and reopened after a failure.

    Args:
        addr: ``"HOST:PORT"``.
        connect_timeout_s: how long opening the connection may take.
        request_timeout_s: default timeout of a request, response included.
        max_in_flight: requests sent and not yet answered; more wait for a slot.
        max_frame_bytes: the largest response frame accepted.
        tls: TLS options, True (TLS, the system's CAs), or None/False (plaintext). A failed
            handshake raises :class:`~tidewire.security.tls.TlsError` (not retriable), naming why.
        credentials: an API key to authenticate each new connection with (SASL SCRAM or
            PLAIN, right after it opens), or None.

    Raises:
        InvalidConfigError: a TLS file cannot be loaded.
    """

    def __init__(
        self,
        addr: str,
        *,
        connect_timeout_s: float = 10.0,
        request_timeout_s: float = 30.0,
        max_in_flight: int = 64,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        tls: TlsOptions | bool | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self.host, self.port = parse_addr(addr)
        self.tls = TlsOptions.of(tls)
        self._ssl = self.tls.context() if self.tls is not None else None
        self.credentials = credentials
        #: The principal the broker authenticated the current connection as ("": none).
        self.principal = ""
        #: How long the broker held produce and fetch answers back in all (ms), because the
        #: principal was over its quota (``throttle_time_ms`` of each answer).
        self.throttle_time_ms_total = 0
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.max_in_flight = max_in_flight
        self.max_frame_bytes = max_frame_bytes
        self._conn: Connection | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._waiting: dict[int, asyncio.Future[ResponseReceived]] = {}
        #: Awaited before each request is sent: what must go ahead of it (settlements asked
        #: for without waiting, so that a later request of the same client sees them done).
        self.before_request: list[Callable[[], Awaitable[None]]] = []
        self._slots = asyncio.Semaphore(max_in_flight)
        self._connect_lock = asyncio.Lock()
        self._backoff = 0.0
        self._closed = False
        #: Called with every push frame, from the reader task (None: pushes are logged and
        #: dropped). It must not block.
        self.on_push: Callable[[PushReceived], None] | None = None
        #: Called when a connection is lost (not when the transport is closed): push
        #: subscriptions die with their connection and must be made again.
        self.on_lost: Callable[[TidewireError], None] | None = None

    async def _connect(self) -> Connection:
        async with self._connect_lock:
            if self._conn is not None:
                return self._conn
            if self._closed:
                raise ConnectionLostError("the client is closed")
            if self._backoff:
                await asyncio.sleep(self._backoff)
            try:
                # asyncio.timeout, not wait_for: in Python 3.11 a wait_for cancelled just as
                # the connection opened drops the (reader, writer) it got, and the socket
                # leaks; here the cancellation lands inside open_connection, which closes it.
                async with asyncio.timeout(self.connect_timeout_s):
                    reader, writer = await self._open()
            except ssl.SSLError as exc:  # a certificate or TLS setting: retrying cannot help
                raise TlsError(self._tls_failure(exc)) from exc
            except (OSError, TimeoutError) as exc:
                self._backoff = min(max(self._backoff * 2, BACKOFF_MIN_S), BACKOFF_MAX_S)
                raise ConnectionLostError(
                    f"cannot connect to {self.host}:{self.port}: {exc or 'timed out'}"
                ) from exc
            if self.closed:  # close() ran while connecting
                writer.close()
                raise ConnectionLostError("the client is closed")
            self._backoff = 0.0
            conn = Connection(
                Role.CLIENT,
                max_frame_bytes=self.max_frame_bytes,
                max_in_flight=self.max_in_flight,
            )
            self._conn, self._writer = conn, writer
            self._reader_task = asyncio.get_running_loop().create_task(
                self._read_loop(conn, reader), name=f"tidewire reader {self.host}:{self.port}"
            )
            if self.credentials is not None:
                try:
                    await self._authenticate(conn, writer, self.credentials)
                except BaseException as exc:
                    if self._conn is conn:
                        self._conn = self._writer = None
                    task, self._reader_task = self._reader_task, None
                    writer.close()
                    if not isinstance(exc, asyncio.CancelledError):
                        # Closed for good before the error goes up: a loop stopped right
                        # after (a command that exits) must not leave the socket open.
                        if task is not None:
                            await cancel_and_wait(task)
                        try:
                            await asyncio.wait_for(writer.wait_closed(), CLOSE_TIMEOUT_S)
                        except (OSError, TimeoutError):
                            writer.transport.abort()
                    raise
            return conn

    async def _exchange(
        self, conn: Connection, writer: asyncio.StreamWriter, body: Body
    ) -> ResponseReceived:
        """One request on ``conn`` before it is handed out (the authentication steps)."""
        corr, buffers = conn.send_request(body, ())
        fut: asyncio.Future[ResponseReceived] = asyncio.get_running_loop().create_future()
        self._waiting[corr] = fut
        try:
            async with asyncio.timeout(self.request_timeout_s):
                writer.writelines(buffers)
                await self._drain(writer)
                response = await fut
        except TimeoutError:
            raise RequestTimedOutError(
                f"no answer to {type(body).__name__} within {self.request_timeout_s:g} s"
            ) from None
        finally:
            if self._waiting.get(corr) is fut:
                del self._waiting[corr]
        if response.error is not None:
            raise response.error
        return response

    async def _authenticate(
        self, conn: Connection, writer: asyncio.StreamWriter, creds: Credentials
    ) -> None:
        """SASL right after the connection opens: SASL_HANDSHAKE, then SCRAM's two rounds
        or PLAIN's one.

        Raises:
            AuthenticationFailedError, UnsupportedSaslMechanismError,
            TooManyAuthFailuresError: the broker refused.
        """
        await self._exchange(conn, writer, SaslHandshakeRequest(mechanism=creds.mechanism))
        if creds.mechanism == "PLAIN":
            message = b"\0\0" + creds.api_key.encode()
            r = await self._exchange(conn, writer, SaslAuthenticateRequest(auth_bytes=message))
        else:
            scram = ScramClient(creds.mechanism, creds.key_id, creds.secret)
            r = await self._exchange(
                conn, writer, SaslAuthenticateRequest(auth_bytes=scram.first())
            )
            assert isinstance(r.body, SaslAuthenticateResponse)
            final = scram.final(r.body.auth_bytes)
            r = await self._exchange(conn, writer, SaslAuthenticateRequest(auth_bytes=final))
            assert isinstance(r.body, SaslAuthenticateResponse)
            scram.verify(r.body.auth_bytes)  # the broker knows the key too: not an impostor
        assert isinstance(r.body, SaslAuthenticateResponse)
        self.principal = r.body.principal

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._ssl is None:
            return await asyncio.open_connection(self.host, self.port)
        assert self.tls is not None
        return await asyncio.open_connection(
            self.host,
            self.port,
            ssl=self._ssl,
            server_hostname=self.tls.server_hostname or self.host,
            ssl_handshake_timeout=self.connect_timeout_s,
        )

    def _tls_failure(self, exc: ssl.SSLError) -> str:
        why = getattr(exc, "verify_message", None) or exc.reason or str(exc)
        if isinstance(exc, ssl.SSLCertVerificationError):
            why = f"certificate verify failed: {why}"
        hint = _TLS_HINTS.get(exc.reason or "", "")
        return f"TLS with {self.host}:{self.port} failed: {why}{hint}"

    async def request(
        self,
        body: Body,
        data: Sequence[Buffer] = (),
        *,
        timeout_s: float | None = None,
        expect_response: bool = True,
    ) -> ResponseReceived | None:
        """Send one request and return its response (``None`` when none is expected).

        Raises:
            ConnectionLostError: no connection, or it broke before the response came.
            RequestTimedOutError: no response within the timeout.
            TidewireError: the broker refused the request as a whole (``response.error``).
        """
        timeout = self.request_timeout_s if timeout_s is None else timeout_s
        for hook in self.before_request:
            await hook()
        async with self._slots:
            conn = await self._connect()
            corr, buffers = conn.send_request(body, data)
            writer = self._writer
            assert writer is not None
            if not expect_response:
                conn.forget(corr, expect_response=False)
                writer.writelines(buffers)
                await self._drain(writer)
                return None
            fut: asyncio.Future[ResponseReceived] = asyncio.get_running_loop().create_future()
            self._waiting[corr] = fut
            try:
                async with asyncio.timeout(timeout):  # sending counts against it too
                    writer.writelines(buffers)
                    await self._drain(writer)
                    response = await fut
            except TimeoutError:
                raise RequestTimedOutError(
                    f"no response to {type(body).__name__} within {timeout:g} s"
                ) from None
            finally:
                # Only its own: after a reconnect the same correlation id may be a newer
                # request's, whose answer would then be dropped and never come.
                if self._waiting.get(corr) is fut:
                    del self._waiting[corr]
                answered = fut.done() and not fut.cancelled()
                if answered:
                    # A failure _drop set while this request raised its own (a failed
                    # write) counts as seen: no "exception was never retrieved" at exit.
                    fut.exception()
                if not answered and self._conn is conn:
                    # Timed out or cancelled: free its place, drop its late response.
                    conn.forget(corr)
        if response.error is not None:
            raise response.error
        body = response.body
        if type(body) is ProduceResponse or type(body) is FetchResponse:
            self.throttle_time_ms_total += body.throttle_time_ms
        return response

    async def _drain(self, writer: asyncio.StreamWriter) -> None:
        try:
            await writer.drain()
        except (OSError, RuntimeError) as exc:  # RuntimeError: the transport is closing
            self._drop(ConnectionLostError(f"writing to {self.host}:{self.port} failed: {exc}"))
            raise ConnectionLostError(f"writing to {self.host}:{self.port} failed: {exc}") from exc

    async def _read_loop(self, conn: Connection, reader: asyncio.StreamReader) -> None:
        error: TidewireError = ConnectionLostError(f"{self.host}:{self.port} closed the connection")
        try:
            while True:
                event = conn.next_event()
                if event is NEED_DATA:
                    try:
                        chunk = await reader.read(READ_CHUNK)
                    except ssl.SSLError as exc:  # an alert: e.g. no client certificate
                        error = TlsError(self._tls_failure(exc))
                        return
                    except OSError as exc:
                        error = ConnectionLostError(f"reading from {self.host}:{self.port}: {exc}")
                        return
                    conn.receive_data(chunk)
                    continue
                if isinstance(event, ConnectionClosed):
                    return
                if isinstance(event, ResponseReceived):
                    if event.correlation_id == -1 and event.error is not None:
                        error = event.error  # the broker is closing the connection: why
                        return
                    fut = self._waiting.get(event.correlation_id)
                    if fut is not None and not fut.done():
                        fut.set_result(event)
                elif isinstance(event, PushReceived):
                    if self.on_push is not None:
                        self.on_push(event)
                    else:
                        log.debug("push frame for subscription %d ignored", event.subscription_id)
        except ProtocolError as exc:
            error = exc
        finally:
            if self._conn is conn:
                self._drop(error)

    def _drop(self, error: TidewireError) -> None:
        """Forget the connection and fail every request waiting on it."""
        writer, self._writer, self._conn = self._writer, None, None
        if writer is not None:
            writer.close()
        for fut in self._waiting.values():
            if not fut.done():
                # As it is: a retriable loss, or the broker's reason (e.g. FrameTooLargeError,
                # which resending would only repeat).
                fut.set_exception(error)
        self._waiting.clear()
        if writer is not None and not self._closed and self.on_lost is not None:
            self.on_lost(error)

    async def close(self) -> None:
        """Close the connection; waiting requests fail with ConnectionLostError."""
        self._closed = True
        writer = self._writer
        self._drop(ConnectionLostError("the client was closed"))
        task, self._reader_task = self._reader_task, None
        if task is not None:
            await cancel_and_wait(task)
        if writer is not None:
            # TLS says goodbye (close_notify) before the socket closes: wait for it, briefly,
            # so that a loop stopped right after does not leave the socket open.
            try:
                await asyncio.wait_for(writer.wait_closed(), CLOSE_TIMEOUT_S)
            except (OSError, TimeoutError):
                writer.transport.abort()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def connected(self) -> bool:
        return self._conn is not None
