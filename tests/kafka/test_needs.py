"""Every Kafka API the listener serves declares what it needs (as the binary protocol's
APIs do), and the declarations name the resources of the request."""

from __future__ import annotations

from typing import Any

import pytest

from tidewire.protocol.kafka import SUPPORTED, ApiKey
from tidewire.protocol.kafka.schema import layout
from tidewire.security.model import Operation, ResourceType
from tidewire.server.kafka.dispatch import registry
from tidewire.server.kafka.handlers import DATA_HANDLERS
from tidewire.server.kafka.needs import DATA_NEEDS, PUBLIC
from tidewire.server.needs import Need


def test_every_served_api_declares_its_needs() -> None:
    handlers, needs = registry()
    assert set(DATA_HANDLERS) <= set(handlers)
    missing = [ApiKey(k).name for k in handlers if k not in needs]
    assert not missing, f"Kafka APIs without a needs entry: {missing}"
    assert set(DATA_NEEDS) == set(DATA_HANDLERS)
    # Nothing is served that the codec does not advertise.
    assert set(handlers) <= set(SUPPORTED)


def _empty(api_key: int) -> dict[str, Any]:
    """A decoded request body of the newest advertised version, every field at its default."""
    lay = layout(api_key, "request", SUPPORTED[api_key][1])
    assert lay is not None
    return {f.name: f.default for f in (*lay.fields, *lay.tagged, *lay.absent)}


@pytest.mark.parametrize("api_key", sorted(DATA_NEEDS), ids=lambda k: ApiKey(k).name)
def test_each_requirement_reads_a_default_body(api_key: int) -> None:
    req = DATA_NEEDS[api_key]
    if callable(req):
        assert isinstance(req(_empty(api_key)), list)


def test_only_the_handshake_is_public() -> None:
    public = {ApiKey(k).name for k, v in DATA_NEEDS.items() if v is PUBLIC}
    assert public == {"API_VERSIONS", "SASL_HANDSHAKE", "SASL_AUTHENTICATE"}


def test_needs_name_the_topics_of_the_request() -> None:
    t = ResourceType.TOPIC
    produce = DATA_NEEDS[ApiKey.PRODUCE]
    assert callable(produce)
    body = {"topic_data": [{"name": "a"}, {"name": "b"}, {"name": "a"}]}
    assert produce(body) == [
        Need(t, Operation.WRITE, "a"),
        Need(t, Operation.WRITE, "b"),
        Need(t, Operation.CREATE, "a", if_missing=True),
        Need(t, Operation.CREATE, "b", if_missing=True),
    ]
    metadata = DATA_NEEDS[ApiKey.METADATA]
    assert callable(metadata)
    assert metadata({"topics": None, "allow_auto_topic_creation": True}) == []
    assert metadata({"topics": [{"name": "x"}], "allow_auto_topic_creation": True}) == [
        Need(t, Operation.DESCRIBE, "x"),
        Need(t, Operation.CREATE, "x", if_missing=True),
    ]
    fetch = DATA_NEEDS[ApiKey.FETCH]
    assert callable(fetch)
    assert fetch({"topics": [{"topic": "f"}]}) == [Need(t, Operation.READ, "f")]
    configs = DATA_NEEDS[ApiKey.DESCRIBE_CONFIGS]
    assert callable(configs)
    assert configs(
        {"resources": [{"resource_type": 2, "resource_name": "c"}, {"resource_type": 4}]}
    ) == [Need(t, Operation.DESCRIBE, "c"), Need(ResourceType.CLUSTER, Operation.DESCRIBE)]
