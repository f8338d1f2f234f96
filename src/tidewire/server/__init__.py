"""The broker's network listeners: the binary-protocol TCP server.

Public names::

    TcpServer, ServerConfig
"""

from __future__ import annotations

from tidewire.server.tcp import ServerConfig, TcpServer

__all__ = ["ServerConfig", "TcpServer"]
