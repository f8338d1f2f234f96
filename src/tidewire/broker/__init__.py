"""The broker: topics of partitioned logs, produce, fetch with long-poll, offsets.

Public names::

    Broker, BrokerConfig, BrokerStats
    ProduceResult, FetchResult, PartitionStatus

They are imported from :mod:`tidewire.broker.core` when first used, so that importing a
light module of this package (``tidewire.broker.queues.model``, which the CLI's queue
commands use) does not load the broker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidewire import _lazy

if TYPE_CHECKING:
    from tidewire.broker.core import (
        Broker,
        BrokerConfig,
        BrokerStats,
        FetchResult,
        PartitionStatus,
        ProduceResult,
    )

__all__ = [
    "Broker",
    "BrokerConfig",
    "BrokerStats",
    "FetchResult",
    "PartitionStatus",
    "ProduceResult",
]


if not TYPE_CHECKING:  # for mypy the names are the imports above, a typo an error
    __getattr__, __dir__ = _lazy.exports(__name__, dict.fromkeys(__all__, "tidewire.broker.core"))
