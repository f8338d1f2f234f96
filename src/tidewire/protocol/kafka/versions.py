"""The Kafka APIs tidewire serves and the versions ApiVersions advertises.

The ranges start from Kafka 2.3's, the last release before flexible versions, because
clients pick, for each API, the highest version both sides support. Produce starts at v3
and Fetch at v4: older versions carry message formats v0 and v1, which tidewire does not
store (it keeps RecordBatch v2, byte for byte). DescribeCluster (Kafka 2.8) exists only in
flexible versions. A version is advertised only once its semantics are tested.
"""

from __future__ import annotations

import enum

__all__ = ["SUPPORTED", "ApiKey"]


class ApiKey(enum.IntEnum):
    """Kafka's API keys of the APIs tidewire serves."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    INIT_PRODUCER_ID = 22
    DESCRIBE_CONFIGS = 32
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    DESCRIBE_CLUSTER = 60


#: ``api key -> (min version, max version)`` as ApiVersions answers them.
SUPPORTED: dict[int, tuple[int, int]] = {
    ApiKey.PRODUCE: (3, 7),
    ApiKey.FETCH: (4, 11),
    ApiKey.LIST_OFFSETS: (0, 5),
    ApiKey.METADATA: (0, 8),
    ApiKey.OFFSET_COMMIT: (0, 7),
    ApiKey.OFFSET_FETCH: (0, 5),
    ApiKey.FIND_COORDINATOR: (0, 2),
    ApiKey.JOIN_GROUP: (0, 5),
    ApiKey.HEARTBEAT: (0, 3),
    ApiKey.LEAVE_GROUP: (0, 2),
    ApiKey.SYNC_GROUP: (0, 3),
    ApiKey.DESCRIBE_GROUPS: (0, 3),
    ApiKey.LIST_GROUPS: (0, 2),
    ApiKey.SASL_HANDSHAKE: (0, 1),
    ApiKey.API_VERSIONS: (0, 2),
    ApiKey.CREATE_TOPICS: (0, 4),
    ApiKey.DELETE_TOPICS: (0, 3),
    ApiKey.INIT_PRODUCER_ID: (0, 1),
    ApiKey.DESCRIBE_CONFIGS: (0, 2),
    ApiKey.SASL_AUTHENTICATE: (0, 1),
    ApiKey.CREATE_PARTITIONS: (0, 1),
    ApiKey.DELETE_GROUPS: (0, 1),
    ApiKey.DESCRIBE_CLUSTER: (0, 1),
}
