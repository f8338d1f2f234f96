"""Python clients of the binary protocol: :class:`AsyncClient` and its blocking twin
:class:`Client`, with the same methods.

Public names::

    AsyncClient, Client, Message, FetchedRecords
"""

from __future__ import annotations

from tidewire.client._client import AsyncClient, Client, FetchedRecords, Message

__all__ = ["AsyncClient", "Client", "FetchedRecords", "Message"]
