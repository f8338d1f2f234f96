"""The cluster layer: metadata and leadership through etcd (see :mod:`tidewire.cluster.etcd`).

:func:`cluster_node` is how the request handlers learn whether their broker runs as a node of
a cluster: a lookup in a weak map, without importing etcd's client (a single node never loads
it)."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidewire.broker import Broker
    from tidewire.cluster.node import ClusterNode

__all__ = ["attach_node", "cluster_node", "detach_node"]

_NODES: weakref.WeakKeyDictionary[Broker, ClusterNode] = weakref.WeakKeyDictionary()


def attach_node(broker: Broker, node: ClusterNode) -> None:
    """Make ``broker`` a node of a cluster: from now on its METADATA, CREATE_TOPIC and
    DELETE_TOPIC answers go through ``node``."""
    _NODES[broker] = node


def detach_node(broker: Broker) -> None:
    _NODES.pop(broker, None)


def cluster_node(broker: Broker) -> ClusterNode | None:
    """The cluster node ``broker`` runs as, None for a single node."""
    return _NODES.get(broker) if _NODES else None
