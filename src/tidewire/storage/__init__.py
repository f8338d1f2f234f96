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

from typing import TYPE_CHECKING

from tidewire import _lazy

if TYPE_CHECKING:
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


#: Where each public name is defined: imported when first used, so that importing a light
#: module of this package (``tidewire.storage.config``, which the CLI uses) does not load
#: the storage engine.
_WHERE = {
    "FsyncPolicy": "tidewire.storage.config",
    "LogConfig": "tidewire.storage.config",
    "Damage": "tidewire.storage.damage",
    "FaultFS": "tidewire.storage.faultfs",
    "PowerCut": "tidewire.storage.faultfs",
    "FileHandle": "tidewire.storage.fs",
    "FileSystem": "tidewire.storage.fs",
    "OsFileSystem": "tidewire.storage.fs",
    "write_atomic": "tidewire.storage.fs",
    "AppendInfo": "tidewire.storage.log",
    "PartitionLog": "tidewire.storage.log",
    "ReadResult": "tidewire.storage.log",
    "RecoveryReport": "tidewire.storage.log",
    "intact_records": "tidewire.storage.log",
    "LogManager": "tidewire.storage.manager",
    "validate_topic_name": "tidewire.storage.manager",
    "BadBatch": "tidewire.storage.segment",
}


if not TYPE_CHECKING:  # for mypy the names are the imports above, a typo an error
    __getattr__, __dir__ = _lazy.exports(__name__, _WHERE)
