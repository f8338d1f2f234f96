"""The storage engine: segmented partition logs, durability policies, recovery.

Public names::

    LogManager            a data directory of partition logs
    PartitionLog          one partition: append, read, flush, truncate, retention
    LogConfig, FsyncPolicy
    AppendInfo, ReadResult, RecoveryReport
    Damage                a damaged range of a log (never served; see PartitionLog.damage)
    FileSystem, OsFileSystem, write_atomic   the file-system seam
    FaultFS, PowerCut     in-memory file system with power cuts and I/O errors (for tests)
"""

from __future__ import annotations

from tidewire.storage.config import FsyncPolicy, LogConfig
from tidewire.storage.damage import Damage
from tidewire.storage.faultfs import FaultFS, PowerCut
from tidewire.storage.fs import FileHandle, FileSystem, OsFileSystem, write_atomic
from tidewire.storage.log import (
    AppendInfo,
    PartitionLog,
    ReadResult,
    RecoveryReport,
    intact_records,
)
from tidewire.storage.manager import LogManager, validate_topic_name
from tidewire.storage.segment import BadBatch

__all__ = [
    "AppendInfo",
    "BadBatch",
    "Damage",
    "FaultFS",
    "FileHandle",
    "FileSystem",
    "FsyncPolicy",
    "LogConfig",
    "LogManager",
    "OsFileSystem",
    "PartitionLog",
    "PowerCut",
    "ReadResult",
    "RecoveryReport",
    "intact_records",
    "validate_topic_name",
    "write_atomic",
]
