"""The descriptor budget shared by every listener: the binary one and the HTTP ones.

Each open connection holds a descriptor. At start, what the descriptor limit leaves after the
log files (``max_open_files``) and :data:`~tidewire.server.tcp.RESERVED_DESCRIPTORS` must hold
the binary listener's ``max_connections`` plus ``http_max_connections`` for each HTTP
listener that is on. When they do not fit:

- caps left at their defaults are lowered: both in proportion to their defaults when neither
  was set, or the defaulted one takes what the set one leaves (one warning line names the
  numbers);
- a value set explicitly is never lowered: when the set values alone do not fit, or leave no
  connection for a defaulted cap, the start is refused with
  :class:`~tidewire.errors.InvalidConfigError` naming the numbers.

A value equal to its default counts as a default. With no HTTP listener the binary listener
checks its cap alone (:meth:`~tidewire.server.tcp.TcpServer.start`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from tidewire.broker import Broker
from tidewire.errors import InvalidConfigError
from tidewire.server.http.config import DEFAULT_MAX_CONNECTIONS as DEFAULT_HTTP_CONNECTIONS
from tidewire.server.http.config import OFF, HttpConfig
from tidewire.server.tcp import DEFAULT_MAX_CONNECTIONS, RESERVED_DESCRIPTORS, ServerConfig

__all__ = ["ConnectionBudget", "fit_broker_listeners", "fit_listeners"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ConnectionBudget:
    """The caps that fit, and the warning to log when they were lowered (else None)."""

    max_connections: int
    http_max_connections: int
    warning: str | None


def fit_listeners(
    *,
    limit: int,
    max_open_files: int,
    max_connections: int,
    http_max_connections: int,
    http_listeners: int,
) -> ConnectionBudget:
    """Fit ``max_connections`` plus ``http_listeners`` times ``http_max_connections`` under
    ``limit`` (see the module docstring). ``max_connections`` 0: no binary listener.

    Raises:
        InvalidConfigError: a value set explicitly does not fit, or nothing fits at all.
    """
    n = http_listeners
    left = limit - max_open_files - RESERVED_DESCRIPTORS
    need = max_connections + n * http_max_connections
    if need <= left:
        return ConnectionBudget(max_connections, http_max_connections, None)
    binary = f"max_connections={max_connections:,} and " if max_connections else ""
    why = (
        f"{binary}http_max_connections="
        f"{http_max_connections:,} on {n} HTTP listener{'s' if n != 1 else ''} need "
        f"{need:,} descriptors, but the descriptor limit is {limit:,}, of which "
        f"{max_open_files:,} are kept for log files (max_open_files) and "
        f"{RESERVED_DESCRIPTORS} for the broker itself: {max(left, 0):,} are left for "
        "connections"
    )
    refused = InvalidConfigError(
        f"{why} (raise the limit, ulimit -n, or lower max_connections, "
        "http_max_connections or max_open_files)"
    )
    binary_set = max_connections != DEFAULT_MAX_CONNECTIONS
    http_set = http_max_connections != DEFAULT_HTTP_CONNECTIONS
    if binary_set and http_set:
        raise refused
    if binary_set:
        tcp, http = max_connections, (left - max_connections) // n
    elif http_set:
        tcp, http = left - n * http_max_connections, http_max_connections
    else:  # both defaults: each in proportion to its default
        tcp, http = max_connections * left // need, http_max_connections * left // need
    if (tcp < 1 and max_connections) or http < 1:
        raise refused
    binary = f"max_connections={tcp:,} and " if max_connections else ""
    return ConnectionBudget(
        tcp, http, f"{why}; so {binary}http_max_connections={http:,} (per listener)"
    )


def fit_broker_listeners(
    broker: Broker, server: ServerConfig, http: HttpConfig, *, binary: bool = True
) -> tuple[ServerConfig, HttpConfig]:
    """``server`` and ``http`` with their connection caps fitted under the started
    ``broker``'s descriptor limit (see :func:`fit_listeners`); the warning, if any, is logged.
    With no HTTP listener on, both are returned as they are (the binary listener checks its
    own cap when it starts). ``binary`` False: no binary listener runs, only HTTP counts.

    Raises:
        InvalidConfigError: a value set explicitly does not fit.
    """
    ports = (http.http_port, http.http_msgbus_port, http.http_ipubsub_port)
    listeners = sum(p != OFF for p in ports)
    if not listeners:
        return server, http
    budget = fit_listeners(
        limit=broker.descriptor_limit,
        max_open_files=broker.max_open_files,
        max_connections=server.max_connections if binary else 0,
        http_max_connections=http.http_max_connections,
        http_listeners=listeners,
    )
    if budget.warning is None:
        return server, http
    log.warning("%s", budget.warning)
    return (
        replace(server, max_connections=budget.max_connections) if binary else server,
        replace(http, http_max_connections=budget.http_max_connections),
    )
