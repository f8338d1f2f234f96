"""tidewire: a pub/sub message broker with partitioned, durable, record-batch topics."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
