"""The queues' metrics, read from the broker's queue manager when ``/metrics`` is scraped
(metrics.py's collector calls :func:`queue_families`): nothing is counted per message on the
queues' hot path, their counters (QueueStatus.counters) are read as they are.

- ``tidewire_queue_messages{queue,state}``: ready, unacked, delayed (gauge);
- ``tidewire_queue_messages_by_fate_total{queue,fate}``: published, delivered, acked,
  redelivered, dead_lettered, expired, dropped (counter; named so that its family does not
  collide with the gauge's in the OpenMetrics format, where a counter's family drops
  ``_total``);
- ``tidewire_queue_publishes_rejected_total{queue}``: publishes refused by reject-publish;
- ``tidewire_queue_consumers{queue}``, ``tidewire_queue_bytes{queue}`` (gauges);
- ``tidewire_queues``: how many queues there are.

Per-queue series count against ``metrics_max_partition_series`` as partitions do: queues
beyond it (by name) have none.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tidewire.errors import InvalidRequestError

if TYPE_CHECKING:
    from tidewire.broker import Broker

__all__ = ["FATES", "STATES", "queue_families"]

#: The counters of QueueStatus.counters exposed as fates, in order.
FATES = ("published", "delivered", "acked", "redelivered", "dead_lettered", "expired", "dropped")
STATES = ("ready", "unacked", "delayed")


def _queues_of(broker: Broker) -> Any:
    try:
        return broker.queues
    except InvalidRequestError:  # not started, or closed
        return None


def queue_families(broker: Broker, cap: int, dropped: list[tuple[int, int]]) -> Iterator[Metric]:
    """The queue metric families of ``broker``, with per-queue series for the first ``cap``
    queues by name; appends to ``dropped`` how many queues had none, and how many there are."""
    manager = _queues_of(broker)
    if manager is None:
        return
    q = ["queue"]
    messages = GaugeMetricFamily(
        "tidewire_queue_messages",
        "Messages of the queue now: ready (deliverable), unacked (delivered, not settled), "
        "delayed (not yet due).",
        labels=["queue", "state"],
    )
    fates = CounterMetricFamily(
        "tidewire_queue_messages_by_fate",
        "Messages of the queue per fate since the broker started: published, delivered, "
        "acked, redelivered, dead_lettered, expired, dropped.",
        labels=["queue", "fate"],
    )
    rejected = CounterMetricFamily(
        "tidewire_queue_publishes_rejected",
        "Publishes the queue refused at its length limit (overflow reject-publish).",
        labels=q,
    )
    consumers = GaugeMetricFamily("tidewire_queue_consumers", "Consumers of the queue.", labels=q)
    size = GaugeMetricFamily(
        "tidewire_queue_bytes", "Stored bytes of the queue's ready, unacked and delayed.", labels=q
    )
    count = GaugeMetricFamily("tidewire_queues", "Queues of the broker.")
    statuses = sorted(manager.queues(), key=lambda s: s.spec.name)
    count.add_metric([], len(statuses))
    for s in statuses[:cap]:
        name = s.spec.name
        messages.add_metric([name, "ready"], s.ready)
        messages.add_metric([name, "unacked"], s.unacked)
        messages.add_metric([name, "delayed"], s.delayed)
        c = s.counters
        for fate in FATES:
            fates.add_metric([name, fate], getattr(c, fate))
        rejected.add_metric([name], c.rejected_publishes)
        consumers.add_metric([name], s.consumers)
        size.add_metric([name], s.bytes)
    dropped.append((max(0, len(statuses) - cap), len(statuses)))
    yield from (messages, fates, rejected, consumers, size, count)
