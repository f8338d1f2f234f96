"""The internal topics of security state (``__security``) and of the audit log (``__audit``):
their settings, and reading one through record by record.

Both are single-partition tidewire logs, so they recover like any other log (torn tail cut,
CRCs checked, damaged ranges skipped and reported) and will replicate with the rest. Clients
never read them: the state holds credential hashes and the audit log who did what; the
broker serves them through its own APIs, behind the gate.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

from tidewire.errors import OffsetOutOfRangeError, PartitionCorruptError, RecordBatchError
from tidewire.records import iter_batches, iter_records
from tidewire.storage import FsyncPolicy, LogConfig, LogManager, PartitionLog

__all__ = [
    "AUDIT_TOPIC",
    "AUDIT_TOPIC_PREFIX",
    "PRIVATE_TOPICS",
    "SECURITY_TOPIC",
    "StoredRecord",
    "audit_config",
    "audit_node_of",
    "audit_topic",
    "is_audit_topic",
    "open_log",
    "read_log",
    "security_config",
]

log = logging.getLogger("tidewire.security")

#: Principals, API keys, ACLs and quotas: every change one record, replayed at start.
SECURITY_TOPIC = "__security"
#: Who did what, from where, allowed or denied.
AUDIT_TOPIC = "__audit"
#: In a cluster, node N's audit log is the replicated topic ``__audit.N`` (one partition):
#: written by node N while it leads it, copied by up to two other nodes.
AUDIT_TOPIC_PREFIX = "__audit."
#: Internal topics no client may read, even with authentication off (and every
#: :func:`is_audit_topic`).
PRIVATE_TOPICS = frozenset({SECURITY_TOPIC, AUDIT_TOPIC})
#: Bytes read at a time.
_READ_CHUNK = 4 * 1024 * 1024


def audit_topic(node_id: int) -> str:
    """The name of node ``node_id``'s audit log in a cluster."""
    return f"{AUDIT_TOPIC_PREFIX}{node_id}"


def audit_node_of(name: str) -> int | None:
    """The node whose audit log topic ``name`` is (None: not a node's audit log)."""
    if not name.startswith(AUDIT_TOPIC_PREFIX):
        return None
    rest = name[len(AUDIT_TOPIC_PREFIX) :]
    return int(rest) if rest.isdigit() and rest.isascii() else None


def is_audit_topic(name: str) -> bool:
    """Whether ``name`` is an audit log: the node's own ``__audit`` or a cluster node's."""
    return name == AUDIT_TOPIC or name.startswith(AUDIT_TOPIC_PREFIX)


def security_config() -> LogConfig:
    """``__security``: a change is acknowledged once fsynced and never deleted."""
    return LogConfig(
        fsync=FsyncPolicy.ALWAYS,
        retention_ms=-1,
        retention_bytes=-1,
        segment_bytes=4 * 1024 * 1024,
    )


def audit_config(retention_ms: int) -> LogConfig:
    """``__audit``: fsynced at an interval (records are batched), kept ``retention_ms``."""
    return LogConfig(
        fsync=FsyncPolicy.INTERVAL,
        flush_interval_ms=200,
        retention_ms=retention_ms,
        retention_bytes=-1,
        segment_bytes=16 * 1024 * 1024,
        segment_ms=24 * 3600 * 1000,
    )


def open_log(logs: LogManager, topic: str, config: LogConfig) -> PartitionLog:
    """Partition 0 of ``topic``, created with ``config`` when missing; an existing one is
    given ``config`` (the broker's settings for it win over what is on disk)."""
    plog = logs.logs.get((topic, 0))
    if plog is None:
        return logs.create_log(topic, 0, config)
    if plog.config != config:
        logs.set_config(topic, 0, config)
    return plog


@dataclass(frozen=True, slots=True)
class StoredRecord:
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None


def read_log(plog: PartitionLog, start: int | None = None) -> Iterator[StoredRecord]:
    """Every intact record of ``plog`` from ``start`` (the log start when None) to its end:
    a damaged range is skipped and logged, the records after it still come."""
    offset = plog.log_start_offset if start is None else max(start, plog.log_start_offset)
    end = plog.log_end_offset
    while offset < end:
        try:
            r = plog.read(offset, _READ_CHUNK)
        except PartitionCorruptError as exc:
            if exc.damage_end <= offset:
                log.error("%s: read up to %d only: %s", plog.directory, offset, exc)
                return
            log.error(
                "%s: records %d..%d are damaged and skipped: %s",
                plog.directory,
                exc.damage_start,
                exc.damage_end - 1,
                exc.message,
            )
            offset = exc.damage_end
            continue
        except OffsetOutOfRangeError as exc:
            log.error("%s: read up to %d only: %s", plog.directory, offset, exc)
            return
        if not r.data:
            return
        view = memoryview(r.data)
        for pos, h in iter_batches(view, verify=False):
            try:
                records = list(iter_records(view[pos : pos + h.size]))
            except RecordBatchError as exc:
                log.error("%s: batch at %d skipped: %s", plog.directory, h.base_offset, exc)
                continue
            for rec in records:
                if rec.offset >= offset:
                    yield StoredRecord(rec.offset, rec.timestamp, rec.key, rec.value)
        offset = r.next_offset
