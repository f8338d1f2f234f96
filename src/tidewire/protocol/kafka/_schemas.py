"""Kafka's request and response schemas of the APIs tidewire serves, as data.

Written by scripts/kafka-schemas from Apache Kafka's message definitions (3.9.0-rc1).
Do not edit: run the script. ``(api_key, kind) -> (name, valid versions, flexible
versions, fields)``; a field is ``(name, type, versions, nullable versions, tag,
tagged versions, default, fields of a struct)``.
"""

# fmt: off
from typing import Any

SCHEMAS: dict[tuple[int, str], Any] = {
    (0, 'request'): ('ProduceRequest', '0-11', '9+', (
        ('transactional_id', 'string', '3+', '3+', -1, 'none', 'null', None),
        ('acks', 'int16', '0+', 'none', -1, 'none', None, None),
        ('timeout_ms', 'int32', '0+', 'none', -1, 'none', None, None),
        ('topic_data', '[]struct', '0+', 'none', -1, 'none', None, (
            ('name', 'string', '0+', 'none', -1, 'none', None, None),
            ('partition_data', '[]struct', '0+', 'none', -1, 'none', None, (
                ('index', 'int32', '0+', 'none', -1, 'none', None, None),
                ('records', 'records', '0+', '0+', -1, 'none', None, None),
            )),
        )),
    )),
    (0, 'response'): ('ProduceResponse', '0-11', '9+', (
        ('responses', '[]struct', '0+', 'none', -1, 'none', None, (
            ('name', 'string', '0+', 'none', -1, 'none', None, None),
            ('partition_responses', '[]struct', '0+', 'none', -1, 'none', None, (
                ('index', 'int32', '0+', 'none', -1, 'none', None, None),
                ('error_code', 'int16', '0+', 'none', -1, 'none', None, None),
                ('base_offset', 'int64', '0+', 'none', -1, 'none', None, None),
                ('log_append_time_ms', 'int64', '2+', 'none', -1, 'none', '-1', None),
                ('log_start_offset', 'int64', '5+', 'none', -1, 'none', '-1', None),
                ('record_errors', '[]struct', '8+', 'none', -1, 'none', None, (
                    ('batch_index', 'int32', '8+', 'none', -1, 'none', None, None),
                    ('batch_index_error_message', 'string', '8+', '8+', -1, 'none', 'null', None),
                )),
                ('error_message', 'string', '8+', '8+', -1, 'none', 'null', None),
                ('current_leader', 'struct', '10+', 'none', 0, '10+', None, (
                    ('leader_id', 'int32', '10+', 'none', -1, 'none', '-1', None),
                    ('leader_epoch', 'int32', '10+', 'none', -1, 'none', '-1', None),
                )),
            )),
        )),
        ('throttle_time_ms', 'int32', '1+', 'none', -1, 'none', '0', None),
        ('node_endpoints', '[]struct', '10+', 'none', 0, '10+', None, (
            ('node_id', 'int32', '10+', 'none', -1, 'none', None, None),
            ('host', 'string', '10+', 'none', -1, 'none', None, None),
            ('port', 'int32', '10+', 'none', -1, 'none', None, None),
            ('rack', 'string', '10+', '10+', -1, 'none', 'null', None),
        )),
    )),
    (1, 'request'): ('FetchRequest', '0-17', '12+', (
        ('cluster_id', 'string', '12+', '12+', 0, '12+', 'null', None),
        ('replica_id', 'int32', '0-14', 'none', -1, 'none', '-1', None),
        ('replica_state', 'struct', '15+', 'none', 1, '15+', None, (
            ('replica_id', 'int32', '15+', 'none', -1, 'none', '-1', None),
            ('replica_epoch', 'int64', '15+', 'none', -1, 'none', '-1', None),
        )),
        ('max_wait_ms', 'int32', '0+', 'none', -1, 'none', None, None),
        ('min_bytes', 'int32', '0+', 'none', -1, 'none', None, None),
        ('max_bytes', 'int32', '3+', 'none', -1, 'none', '0x7fffffff', None),
        ('isolation_level', 'int8', '4+', 'none', -1, 'none', '0', None),
        ('session_id', 'int32', '7+', 'none', -1, 'none', '0', None),
        ('session_epoch', 'int32', '7+', 'none', -1, 'none', '-1', None),
        ('topics', '[]struct', '0+', 'none', -1, 'none', None, (
            ('topic', 'string', '0-12', 'none', -1, 'none', None, None),
            ('topic_id', 'uuid', '13+', 'none', -1, 'none', None, None),
            ('partitions', '[]struct', '0+', 'none', -1, 'none', None, (
                ('partition', 'int32', '0+', 'none', -1, 'none', None, None),
                ('current_leader_epoch', 'int32', '9+', 'none', -1, 'none', '-1', None),
                ('fetch_offset', 'int64', '0+', 'none', -1, 'none', None, None),
                ('last_fetched_epoch', 'int32', '12+', 'none', -1, 'none', '-1', None),
                ('log_start_offset', 'int64', '5+', 'none', -1, 'none', '-1', None),
                ('partition_max_bytes', 'int32', '0+', 'none', -1, 'none', None, None),
                ('replica_directory_id', 'uuid', '17+', 'none', 0, '17+', None, None),
            )),
        )),
        ('forgotten_topics_data', '[]struct', '7+', 'none', -1, 'none', None, (
            ('topic', 'string', '7-12', 'none', -1, 'none', None, None),
            ('topic_id', 'uuid', '13+', 'none', -1, 'none', None, None),
            ('partitions', '[]int32', '7+', 'none', -1, 'none', None, None),
        )),
        ('rack_id', 'string', '11+', 'none', -1, 'none', '', None),
    )),
    (1, 'response'): ('FetchResponse', '0-17', '12+', (
        ('throttle_time_ms', 'int32', '1+', 'none', -1, 'none', None, None),
        ('error_code', 'int16', '7+', 'none', -1, 'none', None, None),
        ('session_id', 'int32', '7+', 'none', -1, 'none', '0', None),
        ('responses', '[]struct', '0+', 'none', -1, 'none', None, (
            ('topic', 'string', '0-12', 'none', -1, 'none', None, None),
            ('topic_id', 'uuid', '13+', 'none', -1, 'none', None, None),
            ('partitions', '[]struct', '0+', 'none', -1, 'none', None, (
                ('partition_index', 'int32', '0+', 'none', -1, 'none', None, None),
                ('error_code', 'int16', '0+', 'none', -1, 'none', None, None),
                ('high_watermark', 'int64', '0+', 'none', -1, 'none', None, None),
                ('last_stable_offset', 'int64', '4+', 'none', -1, 'none', '-1', None),
                ('log_start_offset', 'int64', '5+', 'none', -1, 'none', '-1', None),
                ('diverging_epoch', 'struct', '12+', 'none', 0, '12+', None, (
                    ('epoch', 'int32', '12+', 'none', -1, 'none', '-1', None),
                    ('end_offset', 'int64', '12+', 'none', -1, 'none', '-1', None),
                )),
                ('current_leader', 'struct', '12+', 'none', 1, '12+', None, (
                    ('leader_id', 'int32', '12+', 'none', -1, 'none', '-1', None),
                    ('leader_epoch', 'int32', '12+', 'none', -1, 'none', '-1', None),
                )),
                ('snapshot_id', 'struct', '12+', 'none', 2, '12+', None, (
                    ('end_offset', 'int64', '0+', 'none', -1, 'none', '-1', None),
                    ('epoch', 'int32', '0+', 'none', -1, 'none', '-1', None),
                )),
                ('aborted_transactions', '[]struct', '4+', '4+', -1, 'none', None, (
                    ('producer_id', 'int64', '4+', 'none', -1, 'none', None, None),
                    ('first_offset', 'int64', '4+', 'none', -1, 'none', None, None),
                )),
                ('preferred_read_replica', 'int32', '11+', 'none', -1, 'none', '-1', None),
                ('records', 'records', '0+', '0+', -1, 'none', None, None),
            )),
        )),
        ('node_endpoints', '[]struct', '16+', 'none', 0, '16+', None, (
            ('node_id', 'int32', '16+', 'none', -1, 'none', None, None),
            ('host', 'string', '16+', 'none', -1, 'none', None, None),
            ('port', 'int32', '16+', 'none', -1, 'none', None, None),
            ('rack', 'string', '16+', '16+', -1, 'none', 'null', None),
        )),
    )),
    (2, 'request'): ('ListOffsetsRequest', '0-9', '6+', (
        ('replica_id', 'int32', '0+', 'none', -1, 'none', None, None),
        ('isolation_level', 'int8', '2+', 'none', -1, 'none', None, None),
        ('topics', '[]struct', '0+', 'none', -1, 'none', None, (
            ('name', 'string', '0+', 'none', -1, 'none', None, None),
            ('partitions', '[]struct', '0+', 'none', -1, 'none', None, (
                ('partition_index', 'int32', '0+', 'none', -1, 'none', None, None),
                ('current_leader_epoch', 'int32', '4+', 'none', -1, 'none', '-1', None),
                ('timestamp', 'int64', '0+', 'none', -1, 'none', None, None),
                ('max_num_offsets', 'int32', '0', 'none', -1, 'none', '1', None),
            )),
        )),
    )),
    (2, 'response'): ('ListOffsetsResponse', '0-9', '6+', (
        ('throttle_time_ms', 'int32', '2+', 'none', -1, 'none', None, None),
        ('topics', '[]struct', '0+', 'none', -1, 'none', None, (
            ('name', 'string', '0+', 'none', -1, 'none', None, None),
            ('partitions', '[]struct', '0+', 'none', -1, 'none', None, (
                ('partition_index', 'int32', '0+', 'none', -1, 'none', None, None),
                ('error_code', 'int16', '0+', 'none', -1, 'none', None, None),
                ('old_style_offsets', '[]int64', '0', 'none', -1, 'none', None, None),
                ('timestamp', 'int64', '1+', 'none', -1, 'none', '-1', None),
                ('offset', 'int64', '1+', 'none', -1, 'none', '-1', None),
                ('leader_epoch', 'int32', '4+', 'none', -1, 'none', '-1', None),
            )),
        )),
    )),
    (3, 'request'): ('MetadataRequest', '0-12', '9+', (
        ('topics', '[]struct', '0+', '1+', -1, 'none', None, (
            ('topic_id', 'uuid', '10+', 'none', -1, 'none', None, None),
            ('name', 'string', '0+', '10+', -1, 'none', None, None),
        )),
        ('allow_auto_topic_creation', 'bool', '4+', 'none', -1, 'none', 'true', None),
        ('include_cluster_authorized_operations', 'bool', '8-10', 'none', -1, 'none', None, None),
        ('include_topic_authorized_operations', 'bool', '8+', 'none', -1, 'none', None, None),
    )),
    (3, 'response'): ('MetadataResponse', '0-12', '9+', (
        ('throttle_time_ms', 'int32', '3+', 'none', -1, 'none', None, None),
        ('brokers', '[]struct', '0+', 'none', -1, 'none', None, (
            ('node_id', 'int32', '0+', 'none', -1, 'none', None, None),
            ('host', 'string', '0+', 'none', -1, 'none', None, None),
            ('port', 'int32', '0+', 'none', -1, 'none', None, None),
            ('rack', 'string', '1+', '1+', -1, 'none', 'null', None),
        )),
        ('cluster_id', 'string', '2+', '2+', -1, 'none', 'null', None),
        ('controller_id', 'int32', '1+', 'none', -1, 'none', '-1', None),
        ('topics', '[]struct', '0+', 'none', -1, 'none', None, (
            ('error_code', 'int16', '0+', 'none', -1, 'none', None, None),
            ('name', 'string', '0+', '12+', -1, 'none', None, None),
            ('topic_id', 'uuid', '10+', 'none', -1, 'none', None, None),
            ('is_internal', 'bool', '1+', 'none', -1, 'none', 'false', None),
            ('partitions', '[]struct', '0+', 'none', -1, 'none', None, (
                ('error_code', 'int16', '0+', 'none', -1, 'none', None, None),
                ('partition_index', 'int32', '0+', 'none', -1, 'none', None, None),
                ('leader_id', 'int32', '0+', 'none', -1, 'none', None, None),
                ('leader_epoch', 'int32', '7+', 'none', -1, 'none', '-1', None),
                ('replica_nodes', '[]int32', '0+', 'none', -1, 'none', None, None),
                ('isr_nodes', '[]int32', '0+', 'none', -1, 'none', None, None),
                ('offline_replicas', '[]int32', '5+', 'none', -1, 'none', None, None),
            )),
            ('topic_authorized_operations', 'int32', '8+', 'none', -1, 'none', '-2147483648', None),
        )),
        ('cluster_authorized_operations', 'int32', '8-10', 'none', -1, 'none', '-2147483648', None),
    )),
    (8, 'request'): ('OffsetCommitRequest', '0-9', '8+', (
        ('group_id', 'string', '0+', 'none', -1, 'none', None, None),
        ('generation_id_or_member_epoch', 'int32', '1+', 'none', -1, 'none', '-1', None),
        ('member_id', 'string', '1+', 'none', -1, 'none', None, None),
        ('group_instance_id', 'string', '7+', '7+', -1, 'none', 'null', None),
        ('retention_time_ms', 'int64', '2-4', 'none', -1, 'none', '-1', None),
        ('topics', '[]struct', '0+', 'none', -1, 'none', None, (
            ('name', 'string', '0+', 'none', -1, 'none', None, None),
            ('partitions', '[]struct', '0+', 'none', -1, 'none', None, (
                ('partition_index', 'int32', '0+', 'none', -1, 'none', None, None),
                ('committed_offset', 'int64', '0+', 'none', -1, 'none', None, None),
                ('committed_leader_epoch', 'int32', '6+', 'none', -1, 'none', '-1', None),
                ('commit_timestamp', 'int64', '1', 'none', -1, 'none', '-1', None),
                ('committed_metadata', 'string', '0+', '0+', -1, 'none', None, None),
            )),
        )),
    )),
    (8, 'response'): ('OffsetCommitResponse', '0-9', '8+', (
        ('throttle_time_ms', 'int32', '3+', 'none', -1, 'none', None, None),
        ('topics', '[]struct', '0+', 'none', -1, 'none', None, (
            ('name', 'string', '0+', 'none', -1, 'none', None, None),
            ('partitions', '[]struct', '0+', 'none', -1, 'none', None, (
                ('partition_index', 'int32', '0+', 'none', -1, 'none', None, None),
                ('error_code', 'int16', '0+', 'none', -1, 'none', None, None),
            )),
        )),
    )),
    (9, 'request'): ('OffsetFetchRequest', '0-9', '6+', (
        ('group_id', 'string', '0-7', 'none', -1, 'none', None, None),
        ('topics', '[]struct', '0-7', '2-7', -1, 'none', None, (
            ('name', 'string', '0-7', 'none', -1, 'none', None, None),
            ('partition_indexes', '[]int32', '0-7', 'none', -1, 'none', None, None),
        )),
        ('groups', '[]struct', '8+', 'none', -1, 'none', None, (
            ('group_id', 'string', '8+', 'none', -1, 'none', None, None),
            ('member_id', 'string', '9+', '9+', -1, 'none', 'null', None),
            ('member_epoch', 'int32', '9+', 'none', -1, 'none', '-1', None),
            ('topics', '[]struct', '8+', '8+', -1, 'none', None, (
                ('name', 'string', '8+', 'none', -1, 'none', None, None),
                ('partition_indexes', '[]int32', '8+', 'none', -1, 'none', None, None),
            )),
        )),
        ('require_stable', 'bool', '7+', 'none', -1, 'none', 'false', None),
    )),
    (9, 'response'): ('OffsetFetchResponse', '0-9', '6+', (
        ('throttle_time_ms', 'int32', '3+', 'none', -1, 'none', None, None),
        ('topics', '[]struct', '0-7', 'none', -1, 'none', None, (
            ('name', 'string', '0-7', 'none', -1, 'none', None, None),
            ('partitions', '[]struct', '0-7', 'none', -1, 'none', None, (
                ('partition_index', 'int32', '0-7', 'none', -1, 'none', None, None),
                ('committed_offset', 'int64', '0-7', 'none', -1, 'none', None, None),
                ('committed_leader_epoch', 'int32', '5-7', 'none', -1, 'none', '-1', None),
                ('metadata', 'string', '0-7', '0-7', -1, 'none', None, None),
                ('error_code', 'int16', '0-7', 'none', -1, 'none', None, None),
            )),
        )),
        ('error_code', 'int16', '2-7', 'none', -1, 'none', '0', None),
        ('groups', '[]struct', '8+', 'none', -1, 'none', None, (
            ('group_id', 'string', '8+', 'none', -1, 'none', None, None),
            ('topics', '[]struct', '8+', 'none', -1, 'none', None, (
                ('name', 'string', '8+', 'none', -1, 'none', None, None),
                ('partitions', '[]struct', '8+', 'none', -1, 'none', None, (
                    ('partition_index', 'int32', '8+', 'none', -1, 'none', None, None),
                    ('committed_offset', 'int64', '8+', 'none', -1, 'none', None, None),
                    ('committed_leader_epoch', 'int32', '8+', 'none', -1, 'none', '-1', None),
                    ('metadata', 'string', '8+', '8+', -1, 'none', None, None),
                    ('error_code', 'int16', '8+', 'none', -1, 'none', None, None),
                )),
            )),
            ('error_code', 'int16', '8+', 'none', -1, 'none', '0', None),
        )),
    )),
    (10, 'request'): ('FindCoordinatorRequest', '0-6', '3+', (
        ('key', 'string', '0-3', 'none', -1, 'none', None, None),
        ('key_type', 'int8', '1+', 'none', -1, 'none', '0', None),
        ('coordinator_keys', '[]string', '4+', 'none', -1, 'none', None, None),
    )),
    (10, 'response'): ('FindCoordinatorResponse', '0-6', '3+', (
        ('throttle_time_ms', 'int32', '1+', 'none', -1, 'none', None, None),
        ('error_code', 'int16', '0-3', 'none', -1, 'none', None, None),
        ('error_message', 'string', '1-3', '1-3', -1, 'none', None, None),
        ('node_id', 'int32', '0-3', 'none', -1, 'none', None, None),
        ('host', 'string', '0-3', 'none', -1, 'none', None, None),
        ('port', 'int32', '0-3', 'none', -1, 'none', None, None),
        ('coordinators', '[]struct', '4+', 'none', -1, 'none', None, (
            ('key', 'string', '4+', 'none', -1, 'none', None, None),
            ('node_id', 'int32', '4+', 'none', -1, 'none', None, None),
            ('host', 'string', '4+', 'none', -1, 'none', None, None),
            ('port', 'int32', '4+', 'none', -1, 'none', None, None),
            ('error_code', 'int16', '4+', 'none', -1, 'none', None, None),
            ('error_message', 'string', '4+', '4+', -1, 'none', None, None),
        )),
    )),
    (11, 'request'): ('JoinGroupRequest', '0-9', '6+', (
        ('group_id', 'string', '0+', 'none', -1, 'none', None, None),
        ('session_timeout_ms', 'int32', '0+', 'none', -1, 'none', None, None),
        ('rebalance_timeout_ms', 'int32', '1+', 'none', -1, 'none', '-1', None),
        ('member_id', 'string', '0+', 'none', -1, 'none', None, None),
        ('group_instance_id', 'string', '5+', '5+', -1, 'none', 'null', None),
        ('protocol_type', 'string', '0+', 'none', -1, 'none', None, None),
        ('protocols', '[]struct', '0+', 'none', -1, 'none', None, (
            ('name', 'string', '0+', 'none', -1, 'none', None, None),
            ('metadata', 'bytes', '0+', 'none', -1, 'none', None, None),
        )),
        ('reason', 'string', '8+', '8+', -1, 'none', 'null', None),
    )),
    (11, 'response'): ('JoinGroupResponse', '0-9', '6+', (
        ('throttle_time_ms', 'int32', '2+', 'none', -1, 'none', None, None),
        ('error_code', 'int16', '0+', 'none', -1, 'none', None, None),
        ('generation_id', 'int32', '0+', 'none', -1, 'none', '-1', None),
        ('protocol_type', 'string', '7+', '7+', -1, 'none', 'null', None),
        ('protocol_name', 'string', '0+', '7+', -1, 'none', None, None),
        ('leader', 'string', '0+', 'none', -1, 'none', None, None),
        ('skip_assignment', 'bool', '9+', 'none', -1, 'none', 'false', None),
        ('member_id', 'string', '0+', 'none', -1, 'none', None, None),
        ('members', '[]struct', '0+', 'none', -1, 'none', None, (
            ('member_id', 'string', '0+', 'none', -1, 'none', None, None),
            ('group_instance_id', 'string', '5+', '5+', -1, 'none', 'null', None),
            ('metadata', 'bytes', '0+', 'none', -1, 'none', None, None),
        )),
    )),
    (12, 'request'): ('HeartbeatRequest', '0-4', '4+', (
        ('group_id', 'string', '0+', 'none', -1, 'none', None, None),
        ('generation_id', 'int32', '0+', 'none', -1, 'none', None, None),
        ('member_id', 'string', '0+', 'none', -1, 'none', None, None),
        ('group_instance_id', 'string', '3+', '3+', -1, 'none', 'null', None),
    )),
    (12, 'response'): ('HeartbeatResponse', '0-4', '4+', (
        ('throttle_time_ms', 'int32', '1+', 'none', -1, 'none', None, None),
        ('error_code', 'int16', '0+', 'none', -1, 'none', None, None),
    )),
    (13, 'request'): ('LeaveGroupRequest', '0-5', '4+', (
        ('group_id', 'string', '0+', 'none', -1, 'none', None, None),
        ('member_id', 'string', '0-2', 'none', -1, 'none', None, None),
        ('members', '[]struct', '3+', 'none', -1, 'none', None, (
            ('member_id', 'string', '3+', 'none', -1, 'none', None, None),
            ('group_instance_id', 'string', '3+', '3+', -1, 'none', 'null', None),
            ('reason', 'string', '5+', '5+', -1, 'none', 'null', None),
        )),
    )),
    (13, 'response'): ('LeaveGroupResponse', '0-5', '4+', (
        ('throttle_time_ms', 'int32', '1+', 'none', -1, 'none', None, None),
        ('error_code', 'int16', '0+', 'none', -1, 'none', None, None),
        ('members', '[]struct', '3+', 'none', -1, 'none', None, (
            ('member_id', 'string', '3+', 'none', -1, 'none', None, None),
            ('group_instance_id', 'string', '3+', '3+', -1, 'none', None, None),
            ('error_code', 'int16', '3+', 'none', -1, 'none', None, None),
        )),
    )),
    (14, 'request'): ('SyncGroupRequest', '0-5', '4+', (
        ('group_id', 'string', '0+', 'none', -1, 'none', None, None),
        ('generation_id', 'int32', '0+', 'none', -1, 'none', None, None),
        ('member_id', 'string', '0+', 'none', -1, 'none', None, None),
        ('group_instance_id', 'string', '3+', '3+', -1, 'none', 'null', None),
        ('protocol_type', 'string', '5+', '5+', -1, 'none', 'null', None),
        ('protocol_name', 'string', '5+', '5+', -1, 'none', 'null', None),
        ('assignments', '[]struct', '0+', 'none', -1, 'none', None, (
            ('member_id', 'string', '0+', 'none', -1, 'none', None, None),
            ('assignment', 'bytes', '0+', 'none', -1, 'none', None, None),
        )),
    )),
    (14, 'response'): ('SyncGroupResponse', '0-5', '4+', (
        ('throttle_time_ms', 'int32', '1+', 'none', -1, 'none', None, None),
        ('error_code', 'int16', '0+', 'none', -1, 'none', None, None),
        ('protocol_type', 'string', '5+', '5+', -1, 'none', 'null', None),
        ('protocol_name', 'string', '5+', '5+', -1, 'none', 'null', None),
        ('assignment', 'bytes', '0+', 'none', -1, 'none', None, None),
    )),
    (15, 'request'): ('DescribeGroupsRequest', '0-5', '5+', (
        ('groups', '[]string', '0+', 'none', -1, 'none', None, None),
        ('include_authorized_operations', 'bool', '3+', 'none', -1, 'none', None, None),
    )),
    (15, 'response'): ('DescribeGroupsResponse', '0-5', '5+', (
        ('throttle_time_ms', 'int32', '1+', 'none', -1, 'none', None, None),
        ('groups', '[]struct', '0+', 'none', -1, 'none', None, (
            ('error_code', 'int16', '0+', 'none', -1, 'none', None, None),
            ('group_id', 'string', '0+', 'none', -1, 'none', None, None),
            ('group_state', 'string', '0+', 'none', -1, 'none', None, None),
            ('protocol_type', 'string', '0+', 'none', -1, 'none', None, None),
            ('protocol_data', 'string', '0+', 'none', -1, 'none', None, None),
            ('members', '[]struct', '0+', 'none', -1, 'none', None, (
                ('member_id', 'string', '0+', 'none', -1, 'none', None, None),
                ('group_instance_id', 'string', '4+', '4+', -1, 'none', 'null', None),
                ('client_id', 'string', '0+', 'none', -1, 'none', None, None),
                ('client_host', 'string', '0+', 'none', -1, 'none', None, None),
                ('member_metadata', 'bytes', '0+', 'none', -1, 'none', None, None),
                ('member_assignment', 'bytes', '0+', 'none', -1, 'none', None, None),
            )),
            ('authorized_operations', 'int32', '3+', 'none', -1, 'none', '-2147483648', None),
        )),
    )),
    (16, 'request'): ('ListGroupsRequest', '0-5', '3+', (
        ('states_filter', '[]string', '4+', 'none', -1, 'none', None, None),
        ('types_filter', '[]string', '5+', 'none', -1, 'none', None, None),
    )),
    (16, 'response'): ('ListGroupsResponse', '0-5', '3+', (
        ('throttle_time_ms', 'int32', '1+', 'none', -1, 'none', None, None),
        ('error_code', 'int16', '0+', 'none', -1, 'none', None, None),
        ('groups', '[]struct', '0+', 'none', -1, 'none', None, (
            ('group_id', 'string', '0+', 'none', -1, 'none', None, None),
            ('protocol_type', 'string', '0+', 'none', -1, 'none', None, None),
            ('group_state', 'string', '4+', 'none', -1, 'none', None, None),
            ('group_type', 'string', '5+', 'none', -1, 'none', None, None),
        )),
    )),
    (17, 'request'): ('SaslHandshakeRequest', '0-1', 'none', (
        ('mechanism', 'string', '0+', 'none', -1, 'none', None, None),
    )),
    (17, 'response'): ('SaslHandshakeResponse', '0-1', 'none', (
        ('error_code', 'int16', '0+', 'none', -1, 'none', None, None),
        ('mechanisms', '[]string', '0+', 'none', -1, 'none', None, None),
    )),
    (18, 'request'): ('ApiVersionsRequest', '0-4', '3+', (
        ('client_software_name', 'string', '3+', 'none', -1, 'none', None, None),
        ('client_software_version', 'string', '3+', 'none', -1, 'none', None, None),
    )),
    (18, 'response'): ('ApiVersionsResponse', '0-4', '3+', (
        ('error_code', 'int16', '0+', 'none', -1, 'none', None, None),
        ('api_keys', '[]struct', '0+', 'none', -1, 'none', None, (
            ('api_key', 'int16', '0+', 'none', -1, 'none', None, None),
            ('min_version', 'int16', '0+', 'none', -1, 'none', None, None),
            ('max_version', 'int16', '0+', 'none', -1, 'none', None, None),
        )),
        ('throttle_time_ms', 'int32', '1+', 'none', -1, 'none', None, None),
        ('supported_features', '[]struct', '3+', 'none', 0, '3+', None, (
            ('name', 'string', '3+', 'none', -1, 'none', None, None),
            ('min_version', 'int16', '3+', 'none', -1, 'none', None, None),
            ('max_version', 'int16', '3+', 'none', -1, 'none', None, None),
        )),
        ('finalized_features_epoch', 'int64', '3+', 'none', 1, '3+', '-1', None),
        ('finalized_features', '[]struct', '3+', 'none', 2, '3+', None, (
            ('name', 'string', '3+', 'none', -1, 'none', None, None),
            ('max_version_level', 'int16', '3+', 'none', -1, 'none', None, None),
            ('min_version_level', 'int16', '3+', 'none', -1, 'none', None, None),
        )),
        ('zk_migration_ready', 'bool', '3+', 'none', 3, '3+', 'false', None),
    )),
    (19, 'request'): ('CreateTopicsRequest', '0-7', '5+', (
        ('topics', '[]struct', '0+', 'none', -1, 'none', None, (
            ('name', 'string', '0+', 'none', -1, 'none', None, None),
            ('num_partitions', 'int32', '0+', 'none', -1, 'none', None, None),
            ('replication_factor', 'int16', '0+', 'none', -1, 'none', None, None),
            ('assignments', '[]struct', '0+', 'none', -1, 'none', None, (
                ('partition_index', 'int32', '0+', 'none', -1, 'none', None, None),
                ('broker_ids', '[]int32', '0+', 'none', -1, 'none', None, None),
            )),
            ('configs', '[]struct', '0+', 'none', -1, 'none', None, (
                ('name', 'string', '0+', 'none', -1, 'none', None, None),
                ('value', 'string', '0+', '0+', -1, 'none', None, None),
            )),
        )),
        ('timeout_ms', 'int32', '0+', 'none', -1, 'none', '60000', None),
        ('validate_only', 'bool', '1+', 'none', -1, 'none', 'false', None),
    )),
    (19, 'response'): ('CreateTopicsResponse', '0-7', '5+', (
        ('throttle_time_ms', 'int32', '2+', 'none', -1, 'none', None, None),
        ('topics', '[]struct', '0+', 'none', -1, 'none', None, (
            ('name', 'string', '0+', 'none', -1, 'none', None, None),
            ('topic_id', 'uuid', '7+', 'none', -1, 'none', None, None),
            ('error_code', 'int16', '0+', 'none', -1, 'none', None, None),
            ('error_message', 'string', '1+', '0+', -1, 'none', None, None),
            ('topic_config_error_code', 'int16', '5+', 'none', 0, '5+', None, None),
            ('num_partitions', 'int32', '5+', 'none', -1, 'none', '-1', None),
            ('replication_factor', 'int16', '5+', 'none', -1, 'none', '-1', None),
            ('configs', '[]struct', '5+', '5+', -1, 'none', None, (
                ('name', 'string', '5+', 'none', -1, 'none', None, None),
                ('value', 'string', '5+', '5+', -1, 'none', None, None),
                ('read_only', 'bool', '5+', 'none', -1, 'none', None, None),
                ('config_source', 'int8', '5+', 'none', -1, 'none', '-1', None),
                ('is_sensitive', 'bool', '5+', 'none', -1, 'none', None, None),
            )),
        )),
    )),
    (20, 'request'): ('DeleteTopicsRequest', '0-6', '4+', (
        ('topics', '[]struct', '6+', 'none', -1, 'none', None, (
            ('name', 'string', '6+', '6+', -1, 'none', 'null', None),
            ('topic_id', 'uuid', '6+', 'none', -1, 'none', None, None),
        )),
        ('topic_names', '[]string', '0-5', 'none', -1, 'none', None, None),
        ('timeout_ms', 'int32', '0+', 'none', -1, 'none', None, None),
    )),
    (20, 'response'): ('DeleteTopicsResponse', '0-6', '4+', (
        ('throttle_time_ms', 'int32', '1+', 'none', -1, 'none', None, None),
        ('responses', '[]struct', '0+', 'none', -1, 'none', None, (
            ('name', 'string', '0+', '6+', -1, 'none', None, None),
            ('topic_id', 'uuid', '6+', 'none', -1, 'none', None, None),
            ('error_code', 'int16', '0+', 'none', -1, 'none', None, None),
            ('error_message', 'string', '5+', '5+', -1, 'none', 'null', None),
        )),
    )),
    (22, 'request'): ('InitProducerIdRequest', '0-5', '2+', (
        ('transactional_id', 'string', '0+', '0+', -1, 'none', None, None),
        ('transaction_timeout_ms', 'int32', '0+', 'none', -1, 'none', None, None),
        ('producer_id', 'int64', '3+', 'none', -1, 'none', '-1', None),
        ('producer_epoch', 'int16', '3+', 'none', -1, 'none', '-1', None),
    )),
    (22, 'response'): ('InitProducerIdResponse', '0-5', '2+', (
        ('throttle_time_ms', 'int32', '0+', 'none', -1, 'none', None, None),
        ('error_code', 'int16', '0+', 'none', -1, 'none', None, None),
        ('producer_id', 'int64', '0+', 'none', -1, 'none', '-1', None),
        ('producer_epoch', 'int16', '0+', 'none', -1, 'none', None, None),
    )),
    (32, 'request'): ('DescribeConfigsRequest', '0-4', '4+', (
        ('resources', '[]struct', '0+', 'none', -1, 'none', None, (
            ('resource_type', 'int8', '0+', 'none', -1, 'none', None, None),
            ('resource_name', 'string', '0+', 'none', -1, 'none', None, None),
            ('configuration_keys', '[]string', '0+', '0+', -1, 'none', None, None),
        )),
        ('include_synonyms', 'bool', '1+', 'none', -1, 'none', 'false', None),
        ('include_documentation', 'bool', '3+', 'none', -1, 'none', 'false', None),
    )),
    (32, 'response'): ('DescribeConfigsResponse', '0-4', '4+', (
        ('throttle_time_ms', 'int32', '0+', 'none', -1, 'none', None, None),
        ('results', '[]struct', '0+', 'none', -1, 'none', None, (
            ('error_code', 'int16', '0+', 'none', -1, 'none', None, None),
            ('error_message', 'string', '0+', '0+', -1, 'none', None, None),
            ('resource_type', 'int8', '0+', 'none', -1, 'none', None, None),
            ('resource_name', 'string', '0+', 'none', -1, 'none', None, None),
            ('configs', '[]struct', '0+', 'none', -1, 'none', None, (
                ('name', 'string', '0+', 'none', -1, 'none', None, None),
                ('value', 'string', '0+', '0+', -1, 'none', None, None),
                ('read_only', 'bool', '0+', 'none', -1, 'none', None, None),
                ('is_default', 'bool', '0', 'none', -1, 'none', None, None),
                ('config_source', 'int8', '1+', 'none', -1, 'none', '-1', None),
                ('is_sensitive', 'bool', '0+', 'none', -1, 'none', None, None),
                ('synonyms', '[]struct', '1+', 'none', -1, 'none', None, (
                    ('name', 'string', '1+', 'none', -1, 'none', None, None),
                    ('value', 'string', '1+', '0+', -1, 'none', None, None),
                    ('source', 'int8', '1+', 'none', -1, 'none', None, None),
                )),
                ('config_type', 'int8', '3+', 'none', -1, 'none', '0', None),
                ('documentation', 'string', '3+', '0+', -1, 'none', None, None),
            )),
        )),
    )),
    (36, 'request'): ('SaslAuthenticateRequest', '0-2', '2+', (
        ('auth_bytes', 'bytes', '0+', 'none', -1, 'none', None, None),
    )),
    (36, 'response'): ('SaslAuthenticateResponse', '0-2', '2+', (
        ('error_code', 'int16', '0+', 'none', -1, 'none', None, None),
        ('error_message', 'string', '0+', '0+', -1, 'none', None, None),
        ('auth_bytes', 'bytes', '0+', 'none', -1, 'none', None, None),
        ('session_lifetime_ms', 'int64', '1+', 'none', -1, 'none', '0', None),
    )),
    (37, 'request'): ('CreatePartitionsRequest', '0-3', '2+', (
        ('topics', '[]struct', '0+', 'none', -1, 'none', None, (
            ('name', 'string', '0+', 'none', -1, 'none', None, None),
            ('count', 'int32', '0+', 'none', -1, 'none', None, None),
            ('assignments', '[]struct', '0+', '0+', -1, 'none', None, (
                ('broker_ids', '[]int32', '0+', 'none', -1, 'none', None, None),
            )),
        )),
        ('timeout_ms', 'int32', '0+', 'none', -1, 'none', None, None),
        ('validate_only', 'bool', '0+', 'none', -1, 'none', None, None),
    )),
    (37, 'response'): ('CreatePartitionsResponse', '0-3', '2+', (
        ('throttle_time_ms', 'int32', '0+', 'none', -1, 'none', None, None),
        ('results', '[]struct', '0+', 'none', -1, 'none', None, (
            ('name', 'string', '0+', 'none', -1, 'none', None, None),
            ('error_code', 'int16', '0+', 'none', -1, 'none', None, None),
            ('error_message', 'string', '0+', '0+', -1, 'none', 'null', None),
        )),
    )),
    (42, 'request'): ('DeleteGroupsRequest', '0-2', '2+', (
        ('groups_names', '[]string', '0+', 'none', -1, 'none', None, None),
    )),
    (42, 'response'): ('DeleteGroupsResponse', '0-2', '2+', (
        ('throttle_time_ms', 'int32', '0+', 'none', -1, 'none', None, None),
        ('results', '[]struct', '0+', 'none', -1, 'none', None, (
            ('group_id', 'string', '0+', 'none', -1, 'none', None, None),
            ('error_code', 'int16', '0+', 'none', -1, 'none', None, None),
        )),
    )),
    (60, 'request'): ('DescribeClusterRequest', '0-1', '0+', (
        ('include_cluster_authorized_operations', 'bool', '0+', 'none', -1, 'none', None, None),
        ('endpoint_type', 'int8', '1+', 'none', -1, 'none', '1', None),
    )),
    (60, 'response'): ('DescribeClusterResponse', '0-1', '0+', (
        ('throttle_time_ms', 'int32', '0+', 'none', -1, 'none', None, None),
        ('error_code', 'int16', '0+', 'none', -1, 'none', None, None),
        ('error_message', 'string', '0+', '0+', -1, 'none', 'null', None),
        ('endpoint_type', 'int8', '1+', 'none', -1, 'none', '1', None),
        ('cluster_id', 'string', '0+', 'none', -1, 'none', None, None),
        ('controller_id', 'int32', '0+', 'none', -1, 'none', '-1', None),
        ('brokers', '[]struct', '0+', 'none', -1, 'none', None, (
            ('broker_id', 'int32', '0+', 'none', -1, 'none', None, None),
            ('host', 'string', '0+', 'none', -1, 'none', None, None),
            ('port', 'int32', '0+', 'none', -1, 'none', None, None),
            ('rack', 'string', '0+', '0+', -1, 'none', 'null', None),
        )),
        ('cluster_authorized_operations', 'int32', '0+', 'none', -1, 'none', '-2147483648', None),
    )),
}
