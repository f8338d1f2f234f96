"""Closing a listening socket without losing a connection accepted just before.

asyncio's own event loop (CPython 3.11) accepts a connection in the listening socket's
callback and makes its transport in a task that runs one loop step later. A server closed in
between fails that task (the new transport finds its server closed), and the accepted socket
is left to the garbage collector, open until then: the client waits on a connection nobody
serves, and the collector warns of an unclosed transport wherever it runs.

:func:`close_listener` closes in two steps on that loop: the listening sockets stop listening
at once (new connections are refused from that moment, as a close refuses them), and the
server is closed one loop step later, once the connections already accepted have joined it;
the listener's drain then ends them as it ends the others. uvloop makes a connection's
transport in the accepting callback itself: its servers are closed at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from asyncio.selector_events import BaseSelectorEventLoop

__all__ = ["close_listener"]


def close_listener(server: asyncio.AbstractServer) -> None:
    """Stop ``server`` accepting now and close its listening sockets (on asyncio's own loop,
    one step later: see the module docstring)."""
    loop = server.get_loop()
    if not isinstance(loop, BaseSelectorEventLoop):
        server.close()
        return
    for sock in getattr(server, "sockets", ()):
        loop.remove_reader(sock.fileno())
        # Linux: a listening socket shut down for reading stops listening (new connections
        # are refused, those not yet accepted are reset) and stays open until the close.
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RD)
    loop.call_soon(server.close)
