"""The broker: topics of partitioned logs, produce, fetch with long-poll, offsets.

Public names::

    Broker, BrokerConfig, BrokerStats
    ProduceResult, FetchResult, PartitionStatus

They are imported from :mod:`tidewire.broker.core` when first used, so that importing a
light module of this package (``tidewire.broker.queues.model``, which the CLI's queue
commands use) does not load the broker.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

    def __getattr__(name: str) -> Any:
        if name not in __all__:
            raise AttributeError(f"module 'tidewire.broker' has no attribute {name!r}")
        value = globals()[name] = getattr(importlib.import_module("tidewire.broker.core"), name)
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
