"""TLS under a listener's protocol, telling a client why its handshake failed.

``loop.create_server(ssl=...)`` closes a connection whose handshake fails without sending
the alert OpenSSL wrote for it (asyncio's and uvloop's TLS protocol alike), so the client
sees only a closed connection: a TLS 1.3 client, whose side of the handshake completes
before the broker has checked its certificate, cannot tell a refused certificate from a
broker that went away. :func:`tls_protocol_factory` puts each connection's protocol under
asyncio's own TLS protocol (the one ``create_server(ssl=...)`` uses), which sends the alert
first ("unknown CA", "certificate required", "protocol version"), so clients report the
cause. Where that protocol lacks the hook (a Python whose asyncio differs), the alert is
simply not sent, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from asyncio import sslproto
from collections.abc import Callable
from typing import Any

__all__ = ["tls_protocol_factory"]


class _AlertingSSLProtocol(sslproto.SSLProtocol):
    """asyncio's TLS protocol, sending the pending alert before a failed handshake closes
    the connection."""

    def _on_handshake_complete(self, handshake_exc: BaseException | None) -> None:
        if handshake_exc is not None:
            flush = getattr(self, "_process_outgoing", None)
            if flush is not None:
                with contextlib.suppress(Exception):  # the socket may be gone already
                    flush()
        super()._on_handshake_complete(handshake_exc)


def tls_protocol_factory(
    factory: Callable[..., asyncio.BaseProtocol],
    context: ssl.SSLContext,
    *,
    handshake_timeout_s: float,
) -> Callable[..., asyncio.BaseProtocol]:
    """A protocol factory for ``loop.create_server`` (without ``ssl=``) whose connections
    speak TLS with ``context``; ``factory``'s protocol (made with the arguments the factory
    is called with) sees the decrypted stream, its ``connection_made`` called once the
    handshake succeeded, as with ``ssl=``."""

    def make(*args: Any, **kwargs: Any) -> asyncio.BaseProtocol:
        loop = asyncio.get_running_loop()
        return _AlertingSSLProtocol(
            loop,
            factory(*args, **kwargs),
            context,
            None,  # type: ignore[arg-type]  # no waiter: nobody awaits the handshake
            server_side=True,
            ssl_handshake_timeout=handshake_timeout_s,  # type: ignore[arg-type]  # a float
        )

    return make
