"""The broker: topics of partitioned logs, produce, fetch with long-poll, offsets.

Public names::

    Broker, BrokerConfig, BrokerStats
    ProduceResult, FetchResult, PartitionStatus
"""

from __future__ import annotations

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
