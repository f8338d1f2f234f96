"""The client side of one TCP connection: requests out, responses matched back to their
callers by correlation id, over a sans-IO :class:`~tidewire.protocol.Connection`.

The socket is read through an ``asyncio.BufferedProtocol``: the event loop reads straight into
the frame decoder's buffers (a large frame, such as a fetch response, into a buffer of its own
exact size: no copy of its bytes in user space), and each response is handed to the future of
the request that asked for it in the same callback, without a reader task. Requests wait for a
free in-flight slot rather than fail, every request has a timeout, and a broken connection
fails every request waiting on it with a retriable error; the next request opens a new
connection, after a backoff that doubles up to a cap.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import cast

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
from tidewire.protocol.frames import DEFAULT_MAX_FRAME_BYTES, Buffer, BufferedFrameDecoder
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

__all__ = ["Addresses", "Transport", "parse_addr", "parse_addrs"]

log = logging.getLogger("tidewire.client")

#: The callback of a :meth:`Transport.request_soon` request: its response, or what ended it.
Answered = Callable[["ResponseReceived | TidewireError"], None]


def _answer(on_answer: Answered, got: ResponseReceived | TidewireError) -> None:
    """Call a request's callback from the read path; a bug in it is logged, not raised
    into the loop's read callback (the other answers read with it must still go out)."""
    try:
        on_answer(got)
    except Exception:
        log.exception("a request's answer callback failed")


#: First and largest pause before reconnecting after a failure (seconds).
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 5.0
#: How long :meth:`Transport.close` waits for its connections to close (seconds): a TLS
#: connection exchanges close_notify first; one whose broker does not answer is aborted then.
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


#: What every client takes as its broker's address: ``"HOST:PORT"``, several of them separated
#: by commas (``"h1:7400,h2:7400"``: the bootstrap list of a cluster), or a list of them.
Addresses = str | Sequence[str]


def consumer_connect(
    request_timeout_ms: int,
    connect_timeout_ms: int,
    tls: TlsOptions | bool | None,
    credentials: Credentials | None,
) -> Callable[[Addresses], Transport]:
    """How a consumer opens its connections (to its bootstrap address, and in a cluster to
    each leader or coordinator): its timeouts, TLS and credentials, 8 requests in flight."""

    def connect(address: Addresses) -> Transport:
        return Transport(
            address,
            request_timeout_s=request_timeout_ms / 1000,
            connect_timeout_s=connect_timeout_ms / 1000,
            max_in_flight=8,
            tls=tls,
            credentials=credentials,
        )

    return connect


def parse_addrs(addr: Addresses) -> list[tuple[str, int]]:
    """``"H1:P1,H2:P2"`` (or ``["H1:P1", "H2:P2"]``) -> ``[(h1, p1), (h2, p2)]``, in order,
    without repeats.

    Raises:
        ValueError: an empty list, or an address not of the form ``HOST:PORT``.
    """
    parts = addr.split(",") if isinstance(addr, str) else [str(a) for a in addr]
    out: list[tuple[str, int]] = []
    for part in parts:
        hp = parse_addr(part.strip())
        if hp not in out:
            out.append(hp)
    if not out:
        raise ValueError(f"address {addr!r} names no HOST:PORT")
    return out


class _Link(asyncio.BufferedProtocol):
    """One open connection: the loop reads into its decoder's buffers and it hands what was
    read to its :class:`Transport` (:meth:`Transport._received`); writes go out through it,
    with a wait while the socket's write buffer is over its high-water mark."""

    def __init__(self, owner: Transport, decoder: BufferedFrameDecoder) -> None:
        self.owner = owner
        self.decoder = decoder
        self.conn: Connection | None = None  # set once the connection is open
        self.transport: asyncio.Transport | None = None
        self._paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        #: Done once the connection is lost (closed, aborted or broken): its socket is closed.
        self.gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.lost: TidewireError | None = None

    # --- asyncio.BufferedProtocol -----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; they have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self.decoder.buffer_updated(nbytes)
        if self.conn is not None:
            self.owner._received(self)

    def eof_received(self) -> bool:
        if self.conn is not None:
            self.conn.receive_data(b"")
            self.owner._received(self)
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        if isinstance(exc, ssl.SSLError):  # an alert: e.g. no client certificate
            self.lost = TlsError(self.owner._tls_failure(exc))
        elif exc is not None:
            self.lost = ConnectionLostError(
                f"reading from {self.owner.host}:{self.owner.port}: {exc}"
            )
        else:
            self.lost = ConnectionLostError(
                f"{self.owner.host}:{self.owner.port} closed the connection"
            )
        if not self.gone.done():
            self.gone.set_result(None)
        self._wake_writers()
        self.owner._link_lost(self, self.lost)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_writers()

    # --- writing ----------------------------------------------------------------------------

    def write(self, buffers: list[Buffer]) -> None:
        t = self.transport
        if t is not None and not t.is_closing():
            t.writelines(buffers)

    async def drain(self) -> None:
        """Wait while the write buffer is over its high-water mark.

        Raises:
            ConnectionResetError: the connection is closed or lost.
        """
        while True:
            t = self.transport
            if self.lost is not None or t is None or t.is_closing():
                raise ConnectionResetError("the connection is closed")
            if not self._paused:
                return
            fut = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(fut)
            try:
                await fut
            finally:
                if fut in self._drain_waiters:
                    self._drain_waiters.remove(fut)

    def _wake_writers(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def close(self) -> None:
        # Once only: asyncio's TLS transport, closed a second time, forgets its protocol, and
        # its abort() then does nothing (the socket stays open).
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


async def _close_for_good(links: list[_Link]) -> None:
    """Close ``links`` and return once their sockets are closed. A TLS connection says
    goodbye first (close_notify) and closes when the broker answers; one that is not closed
    within :data:`CLOSE_TIMEOUT_S` is aborted, which closes it a loop step or two later.
    Without the wait, a loop stopped right after (a command that exits) leaves the socket
    open, to be collected unclosed."""
    for link in links:
        link.close()
    pending = [link.gone for link in links if not link.gone.done()]
    if not pending:
        return
    _, late = await asyncio.wait(pending, timeout=CLOSE_TIMEOUT_S)
    if late:
        for link in links:
            if not link.gone.done():
                link.abort()
        await asyncio.wait(late, timeout=CLOSE_TIMEOUT_S)


class Transport:
    """A connection to one broker, opened on first use and reopened after a failure.

    Given several addresses (a cluster's bootstrap list), it connects to the first that
    answers, trying them in turn from the one after the last that failed; ``host`` and
    ``port`` are the address it uses now.

    Args:
        addr: ``"HOST:PORT"``, or several (see :data:`Addresses`).
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
        addr: Addresses,
        *,
        connect_timeout_s: float = 10.0,
        request_timeout_s: float = 30.0,
        max_in_flight: int = 64,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        tls: TlsOptions | bool | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self.addresses = parse_addrs(addr)
        self.host, self.port = self.addresses[0]
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
        self._link: _Link | None = None
        #: Links closed (dropped) and not closed for good yet, which :meth:`close` waits for.
        #: Each leaves within ``ssl_shutdown_timeout`` at most (asyncio's 30 s), a plaintext
        #: one at the next loop step: as many as the connections dropped meanwhile.
        self._closing: set[_Link] = set()
        self._waiting: dict[int, asyncio.Future[ResponseReceived]] = {}
        #: Requests sent by :meth:`request_soon`: their callback and timeout, by correlation id.
        self._answers: dict[int, tuple[Answered, asyncio.TimerHandle]] = {}
        #: Awaited before each request is sent: what must go ahead of it (settlements asked
        #: for without waiting, so that a later request of the same client sees them done).
        self.before_request: list[Callable[[], Awaitable[None]]] = []
        self._slots = asyncio.Semaphore(max_in_flight)
        self._connect_lock = asyncio.Lock()
        self._backoff = 0.0
        self._closed = False
        #: Called with every push frame, from the loop's read callback (None: pushes are logged and
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
                link = await self._open_any()
            except ssl.SSLError as exc:  # a certificate or TLS setting: retrying cannot help
                raise TlsError(self._tls_failure(exc)) from exc
            except (OSError, TimeoutError) as exc:
                self._backoff = min(max(self._backoff * 2, BACKOFF_MIN_S), BACKOFF_MAX_S)
                raise ConnectionLostError(
                    f"cannot connect to {self.host}:{self.port}: {exc or 'timed out'}"
                ) from exc
            if self.closed:  # close() ran while connecting, and did not see this one
                await _close_for_good([link])
                raise ConnectionLostError("the client is closed")
            if link.lost is not None:  # closed by the broker at once (e.g. refused)
                self._backoff = min(max(self._backoff * 2, BACKOFF_MIN_S), BACKOFF_MAX_S)
                raise link.lost
            self._backoff = 0.0
            conn = link.conn
            assert conn is not None
            self._conn, self._link = conn, link
            self._received(link)  # anything that came while connecting
            if self.credentials is not None:
                try:
                    await self._authenticate(conn, link, self.credentials)
                except BaseException as exc:
                    if self._conn is conn:
                        self._conn = self._link = None
                    self._retire(link)  # close() waits for it, if cancelled here
                    if not isinstance(exc, asyncio.CancelledError):
                        # Closed for good before the error goes up: a loop stopped right
                        # after (a command that exits) must not leave the socket open.
                        await _close_for_good([link])
                    raise
            return conn

    async def _exchange(self, conn: Connection, link: _Link, body: Body) -> ResponseReceived:
        """One request on ``conn`` before it is handed out (the authentication steps)."""
        corr, buffers = conn.send_request(body, ())
        fut: asyncio.Future[ResponseReceived] = asyncio.get_running_loop().create_future()
        self._waiting[corr] = fut
        try:
            async with asyncio.timeout(self.request_timeout_s):
                link.write(buffers)
                await self._drain(link)
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

    async def _authenticate(self, conn: Connection, link: _Link, creds: Credentials) -> None:
        """SASL right after the connection opens: SASL_HANDSHAKE, then SCRAM's two rounds
        or PLAIN's one.

        Raises:
            AuthenticationFailedError, UnsupportedSaslMechanismError,
            TooManyAuthFailuresError: the broker refused.
        """
        await self._exchange(conn, link, SaslHandshakeRequest(mechanism=creds.mechanism))
        if creds.mechanism == "PLAIN":
            message = b"\0\0" + creds.api_key.encode()
            r = await self._exchange(conn, link, SaslAuthenticateRequest(auth_bytes=message))
        else:
            scram = ScramClient(creds.mechanism, creds.key_id, creds.secret)
            r = await self._exchange(conn, link, SaslAuthenticateRequest(auth_bytes=scram.first()))
            assert isinstance(r.body, SaslAuthenticateResponse)
            final = scram.final(r.body.auth_bytes)
            r = await self._exchange(conn, link, SaslAuthenticateRequest(auth_bytes=final))
            assert isinstance(r.body, SaslAuthenticateResponse)
            scram.verify(r.body.auth_bytes)  # the broker knows the key too: not an impostor
        assert isinstance(r.body, SaslAuthenticateResponse)
        self.principal = r.body.principal

    async def _open_any(self) -> _Link:
        """Open a connection to the current address or, when it cannot be reached, to the
        next ones in turn (each within ``connect_timeout_s``); the one that answered becomes
        the current address.

        Raises:
            OSError, TimeoutError: the last address's failure, when none could be reached.
            ssl.SSLError: a TLS handshake failed (not retried with the next address).
        """
        count = len(self.addresses)
        start = self.addresses.index((self.host, self.port))
        for i in range(count):
            self.host, self.port = self.addresses[(start + i) % count]
            try:
                # asyncio.timeout, not wait_for: in Python 3.11 a wait_for cancelled just as
                # the connection opened drops what it got, and the socket leaks; here the
                # cancellation lands inside create_connection, which closes it.
                async with asyncio.timeout(self.connect_timeout_s):
                    return await self._open()
            except ssl.SSLError:
                raise
            except (OSError, TimeoutError) as exc:
                if i == count - 1:
                    raise
                log.info(
                    "cannot connect to %s:%d (%s), trying the next address",
                    self.host,
                    self.port,
                    exc or "timed out",
                )
        raise AssertionError("unreachable")  # the loop returns or raises

    async def _open(self) -> _Link:
        decoder = BufferedFrameDecoder(max_frame_bytes=self.max_frame_bytes)
        link = _Link(self, decoder)
        # Room for max_in_flight requests of each kind: those of request(), which take a
        # slot, and those of request_soon(), which refuses more than that many.
        link.conn = Connection(Role.CLIENT, max_in_flight=2 * self.max_in_flight, decoder=decoder)
        loop = asyncio.get_running_loop()
        if self._ssl is None:
            await loop.create_connection(lambda: link, self.host, self.port)
            return link
        assert self.tls is not None
        await loop.create_connection(
            lambda: link,
            self.host,
            self.port,
            ssl=self._ssl,
            server_hostname=self.tls.server_hostname or self.host,
            ssl_handshake_timeout=self.connect_timeout_s,
        )
        return link

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
            link = self._link
            assert link is not None
            if not expect_response:
                conn.forget(corr, expect_response=False)
                link.write(buffers)
                await self._drain(link)
                return None
            fut: asyncio.Future[ResponseReceived] = asyncio.get_running_loop().create_future()
            self._waiting[corr] = fut
            try:
                async with asyncio.timeout(timeout):  # sending counts against it too
                    link.write(buffers)
                    await self._drain(link)
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

    def request_soon(
        self, body: Body, data: Sequence[Buffer], on_answer: Answered, timeout_s: float
    ) -> int | None:
        """Write one request now, from the caller's own step, if nothing has to be waited
        for first; ``on_answer`` is then called with its response (or with the
        ``TidewireError`` that ended it: lost connection, no answer within ``timeout_s``)
        from the loop's read callback. Returns its correlation id (for :meth:`forget_soon`),
        or None, having sent nothing, when the request
        must go through :meth:`request` instead: no open connection, a ``before_request``
        hook, a write buffer over its high-water mark, or ``max_in_flight`` requests of its
        own unanswered (it takes no slot of :meth:`request`'s: the connection has room for
        that many of each).

        What it saves a producer or consumer on the latency path of a lone message: the task
        that :meth:`request` needs (created in one loop turn, run in the next) and the turn
        in which that task resumes after the read callback set its response.
        """
        conn, link = self._conn, self._link
        if (
            conn is None
            or link is None
            or len(self._answers) >= self.max_in_flight
            or self.before_request
            or link._paused
            or link.lost is not None
            or link.transport is None
            or link.transport.is_closing()
        ):
            return None
        corr, buffers = conn.send_request(body, data)
        timer = asyncio.get_running_loop().call_later(
            timeout_s, self._expire, corr, conn, type(body).__name__, timeout_s
        )
        self._answers[corr] = (on_answer, timer)
        link.write(buffers)
        return corr

    def forget_soon(self, corr: int) -> None:
        """Stop waiting for a :meth:`request_soon` request (its callback is not called; a
        late answer is dropped), as a cancelled :meth:`request` does."""
        got = self._answers.pop(corr, None)
        if got is None:
            return
        got[1].cancel()
        if self._conn is not None:
            self._conn.forget(corr)

    def _expire(self, corr: int, conn: Connection, name: str, timeout_s: float) -> None:
        """A :meth:`request_soon` request got no answer in time: free its place, drop its
        late response, tell its caller."""
        got = self._answers.pop(corr, None)
        if got is None:
            return
        if self._conn is conn:
            conn.forget(corr)
        _answer(got[0], RequestTimedOutError(f"no response to {name} within {timeout_s:g} s"))

    async def _drain(self, link: _Link) -> None:
        try:
            await link.drain()
        except OSError as exc:
            self._drop(ConnectionLostError(f"writing to {self.host}:{self.port} failed: {exc}"))
            raise ConnectionLostError(f"writing to {self.host}:{self.port} failed: {exc}") from exc

    def _received(self, link: _Link) -> None:
        """Hand the events of what ``link`` read to their requests (a callback of the loop's
        read: no task, no extra loop turn)."""
        conn = link.conn
        if link is not self._link or conn is not self._conn or conn is None:
            return  # still connecting (handled once it is set), or an old connection
        error: TidewireError | None = None  # made once the connection ends, not per read
        try:
            while True:
                event = conn.next_event()
                if event is NEED_DATA:
                    return
                if isinstance(event, ConnectionClosed):
                    break
                if isinstance(event, ResponseReceived):
                    if event.correlation_id == -1 and event.error is not None:
                        error = event.error  # the broker is closing the connection: why
                        break
                    fut = self._waiting.get(event.correlation_id)
                    if fut is not None:
                        if not fut.done():
                            fut.set_result(event)
                    elif (got := self._answers.pop(event.correlation_id, None)) is not None:
                        got[1].cancel()
                        body = event.body
                        if event.error is None and (
                            type(body) is ProduceResponse or type(body) is FetchResponse
                        ):
                            self.throttle_time_ms_total += body.throttle_time_ms
                        _answer(got[0], event)
                elif isinstance(event, PushReceived):
                    if self.on_push is not None:
                        self.on_push(event)
                    else:
                        log.debug("push frame for subscription %d ignored", event.subscription_id)
        except ProtocolError as exc:
            error = exc
        if self._conn is conn:
            self._drop(
                error
                if error is not None
                else ConnectionLostError(f"{self.host}:{self.port} closed the connection")
            )

    def _link_lost(self, link: _Link, error: TidewireError) -> None:
        self._closing.discard(link)
        if link is self._link:
            self._drop(error)

    def _retire(self, link: _Link) -> None:
        """Close ``link`` and keep it until it is closed for good, for :meth:`close` to wait
        for: a TLS connection closes only once the broker has answered its close_notify (or
        after asyncio's ``ssl_shutdown_timeout``), and one still closing when the loop stops
        leaves its socket open."""
        link.close()
        if link.lost is None:
            self._closing.add(link)

    def _drop(self, error: TidewireError) -> None:
        """Forget the connection and fail every request waiting on it."""
        link, self._link, self._conn = self._link, None, None
        if link is not None:
            self._retire(link)
        for fut in self._waiting.values():
            if not fut.done():
                # As it is: a retriable loss, or the broker's reason (e.g. FrameTooLargeError,
                # which resending would only repeat).
                fut.set_exception(error)
        self._waiting.clear()
        answers, self._answers = self._answers, {}
        for on_answer, timer in answers.values():
            timer.cancel()
            _answer(on_answer, error)
        if link is not None and not self._closed and self.on_lost is not None:
            self.on_lost(error)

    async def close(self) -> None:
        """Close the connection; waiting requests fail with ConnectionLostError. Returns once
        every connection this transport opened is closed: the current one, and those dropped
        before (a broker that refused or went away) that were still closing."""
        self._closed = True
        self._drop(ConnectionLostError("the client was closed"))
        await _close_for_good(list(self._closing))

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def connected(self) -> bool:
        return self._conn is not None

    def reconnect_now(self) -> None:
        """The next request connects without waiting out the backoff of failed connects: for a
        caller that paces its own retries (a cluster client polling for a new leader)."""
        self._backoff = 0.0
