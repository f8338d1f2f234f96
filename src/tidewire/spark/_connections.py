"""One connection per broker address in each Python process of Spark, kept between tasks.

Spark pickles a reader and runs ``read()`` on a copy of it in a Python worker, which it
keeps for the next tasks (``spark.python.worker.reuse``); a connection held here, at module
level, survives from one task to the next, so a task does not pay a connect. A broker that
went away is reconnected on the next request (the client does that by itself).
"""

from __future__ import annotations

import logging
import threading

from tidewire.client import Client, Credentials, TlsOptions
from tidewire.errors import AuthenticationFailedError, TidewireError

__all__ = ["client_for", "discard"]

log = logging.getLogger("tidewire.spark")

_Key = tuple[tuple[str, ...], int, TlsOptions | None, Credentials | None]
_clients: dict[_Key, Client] = {}
_lock = threading.Lock()


def client_for(
    servers: tuple[str, ...],
    request_timeout_ms: int,
    tls: TlsOptions | None = None,
    credentials: Credentials | None = None,
) -> Client:
    """This process's client for ``servers`` (over ``tls``, authenticated with
    ``credentials``): the first of them that answers a ping, tried in order when the
    process first needs one.

    Raises:
        ConnectionLostError, RequestTimedOutError: none of them answered (the last error,
            naming every address tried).
        AuthenticationFailedError: the broker refused the key (not tried elsewhere).
    """
    key = (servers, request_timeout_ms, tls, credentials)
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = _connect(servers, request_timeout_ms / 1000, tls, credentials)
            _clients[key] = client
        return client


def discard(
    servers: tuple[str, ...],
    request_timeout_ms: int,
    tls: TlsOptions | None = None,
    credentials: Credentials | None = None,
) -> None:
    """Close and forget the client for ``servers`` (the next :func:`client_for` connects
    again, to the first address that answers)."""
    with _lock:
        client = _clients.pop((servers, request_timeout_ms, tls, credentials), None)
    if client is not None:
        client.close()


def _connect(
    servers: tuple[str, ...],
    request_timeout_s: float,
    tls: TlsOptions | None,
    credentials: Credentials | None,
) -> Client:
    failure: TidewireError | None = None
    for addr in servers:
        client = Client(addr, request_timeout_s=request_timeout_s, tls=tls, credentials=credentials)
        try:
            client.ping()
        except AuthenticationFailedError:
            client.close()
            raise  # every broker of the cluster knows the same keys
        except TidewireError as exc:
            client.close()
            log.warning("tidewire broker %s did not answer: %s", addr, exc)
            failure = exc
            continue
        return client
    assert failure is not None
    raise type(failure)(f"no tidewire broker answered at {', '.join(servers)}: {failure}")
