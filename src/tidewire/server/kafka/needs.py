"""What each Kafka API needs, declared as data (:data:`DATA_NEEDS`), beside the binary
protocol's table (:mod:`tidewire.server.needs`) and with its vocabulary: :data:`PUBLIC`,
:data:`AUTHENTICATED`, or a function from the decoded request body (a dict) to the
:class:`~tidewire.server.needs.Need` list.

Kafka answers authorization per resource, so the listener asks the gate about each need
alone and hands the handler the set it denied (``ctx.denied``): a produce to two topics,
one of them not writable, gets TOPIC_AUTHORIZATION_FAILED on that one's partitions and is
served for the other. The broker's private topics (``__security``, ``__audit``,
``__streams``, the queues' logs) are denied to everyone, authentication on or off, so they
are never listed, read or written through Kafka.

Needs of a topic are on the topic, as Kafka's are: Produce -> WRITE (+ CREATE when it does
not exist, for auto-creation), Fetch -> READ, ListOffsets and Metadata -> DESCRIBE
(Metadata + CREATE when it asks for auto-creation), CreateTopics -> CREATE,
DeleteTopics -> DELETE, CreatePartitions -> ALTER, DescribeConfigs -> DESCRIBE on each
topic (on the cluster for a broker resource), InitProducerId -> WRITE on the cluster (the
binary protocol's, Kafka's IdempotentWrite), DescribeCluster -> DESCRIBE on the cluster.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tidewire.protocol.kafka import ApiKey
from tidewire.security.model import Operation, ResourceType
from tidewire.server.needs import AUTHENTICATED, PUBLIC, Need, Requirement

__all__ = ["AUTHENTICATED", "DATA_NEEDS", "PUBLIC", "KafkaRequirement", "topic_need"]

#: One API's requirement (the same kinds as the binary protocol's).
KafkaRequirement = Requirement

_T, _C = ResourceType.TOPIC, ResourceType.CLUSTER
_O = Operation
#: DescribeConfigs' resource type of a topic and of a broker (Kafka's ConfigResource.Type).
CONFIG_TOPIC, CONFIG_BROKER = 2, 4


def topic_need(op: Operation, name: str) -> Need:
    """The need of ``op`` on topic ``name`` (what handlers ask ``ctx.allowed`` about)."""
    return Need(_T, op, name)


def _topics(op: Operation, names: Iterable[str]) -> list[Need]:
    return [Need(_T, op, t) for t in dict.fromkeys(names)]


def _produce(body: dict[str, Any]) -> list[Need]:
    names = [t["name"] for t in body["topic_data"]]
    return _topics(_O.WRITE, names) + [
        Need(_T, _O.CREATE, t, if_missing=True) for t in dict.fromkeys(names)
    ]


def _metadata(body: dict[str, Any]) -> list[Need]:
    topics = body["topics"]
    if topics is None:  # every topic: the handler lists those the principal may describe
        return []
    names = [t["name"] for t in topics if t["name"]]
    needs = _topics(_O.DESCRIBE, names)
    if body["allow_auto_topic_creation"]:
        needs += [Need(_T, _O.CREATE, t, if_missing=True) for t in dict.fromkeys(names)]
    return needs


def _describe_configs(body: dict[str, Any]) -> list[Need]:
    out: list[Need] = []
    for r in body["resources"]:
        if r["resource_type"] == CONFIG_TOPIC:
            out.append(Need(_T, _O.DESCRIBE, r["resource_name"]))
        else:
            out.append(Need(_C, _O.DESCRIBE))
    return list(dict.fromkeys(out))


def _cluster(op: Operation) -> KafkaRequirement:
    return lambda body: [Need(_C, op)]


#: Every data, admin and SASL Kafka API's requirement (see the module docstring).
DATA_NEEDS: dict[int, KafkaRequirement] = {
    ApiKey.API_VERSIONS: PUBLIC,
    ApiKey.SASL_HANDSHAKE: PUBLIC,
    ApiKey.SASL_AUTHENTICATE: PUBLIC,
    ApiKey.METADATA: _metadata,
    ApiKey.PRODUCE: _produce,
    ApiKey.FETCH: lambda body: _topics(_O.READ, (t["topic"] for t in body["topics"])),
    ApiKey.LIST_OFFSETS: lambda body: _topics(_O.DESCRIBE, (t["name"] for t in body["topics"])),
    ApiKey.INIT_PRODUCER_ID: _cluster(_O.WRITE),
    ApiKey.CREATE_TOPICS: lambda body: _topics(_O.CREATE, (t["name"] for t in body["topics"])),
    ApiKey.DELETE_TOPICS: lambda body: _topics(
        _O.DELETE,
        [*body["topic_names"], *(t["name"] for t in body["topics"] if t["name"])],
    ),
    ApiKey.CREATE_PARTITIONS: lambda body: _topics(_O.ALTER, (t["name"] for t in body["topics"])),
    ApiKey.DESCRIBE_CONFIGS: _describe_configs,
    ApiKey.DESCRIBE_CLUSTER: _cluster(_O.DESCRIBE),
}
