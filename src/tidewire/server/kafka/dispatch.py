"""The Kafka listener's registry: every API's handler and requirement, the data/admin
APIs' (:mod:`.handlers`, :mod:`.needs`) with the group APIs' (:mod:`.groups`,
:mod:`.group_needs`) when those modules are present.

:func:`registry` is the one place the two are joined; the listener dispatches through it.
"""

from __future__ import annotations

import functools
import importlib

from tidewire.server.kafka.context import KafkaHandler
from tidewire.server.kafka.needs import KafkaRequirement

__all__ = ["registry"]


@functools.cache
def registry() -> tuple[dict[int, KafkaHandler], dict[int, KafkaRequirement]]:
    """``(handlers, needs)`` by API key: :data:`DATA_HANDLERS` and :data:`DATA_NEEDS`, plus
    ``GROUP_HANDLERS`` and ``GROUP_NEEDS`` once the group APIs' modules exist."""
    from tidewire.server.kafka.handlers import DATA_HANDLERS  # noqa: PLC0415 (a cycle)
    from tidewire.server.kafka.needs import DATA_NEEDS  # noqa: PLC0415

    handlers: dict[int, KafkaHandler] = dict(DATA_HANDLERS)
    needs: dict[int, KafkaRequirement] = dict(DATA_NEEDS)
    try:
        groups = importlib.import_module("tidewire.server.kafka.groups")
        group_needs = importlib.import_module("tidewire.server.kafka.group_needs")
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("tidewire.server.kafka.group"):
            raise  # a module they import is missing: a real error
    else:
        handlers.update(groups.GROUP_HANDLERS)
        needs.update(group_needs.GROUP_NEEDS)
    return handlers, needs
