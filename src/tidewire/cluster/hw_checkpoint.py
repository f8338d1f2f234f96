"""The high-watermark checkpoint: the last high watermark this node knew of each partition it
holds in a cluster, kept in one file per data directory (Kafka's
``replication-offset-checkpoint``).

Why: a replica's log may hold records above the high watermark (appended by a leader that
was cut off, or copied by a follower before every in-sync replica had them). Until the node
has been given its role again, nothing else tells it where the committed part ends; read up
to its log end it would serve records the next leader's history may replace. With the
checkpoint, a restarted node serves (and reports) each partition only below the high
watermark it knew last, and a leader elected before any follower fetched starts from it, as
Kafka's does.

The file, :data:`HW_CHECKPOINT_FILE` in the data directory, is JSON written atomically
(``.tmp``, fsync, rename, directory fsync) by the replica manager every
:data:`CHECKPOINT_INTERVAL_S` when something changed, and once more when it closes: one
fsync per interval for the whole node, none per produce::

    {"version": 1, "high_watermarks": {"orders-0": 1200, "orders-1": 977}}

Keys are the partitions' directory names (``<topic>-<partition>``, as in the log manager's
``recovery-point-offset-checkpoint``). A checkpoint that cannot be read is ignored (with a
warning): the node then knows no high watermark, as before its first one.
"""

from __future__ import annotations

import json
import logging

from tidewire.storage.fs import FileSystem, write_atomic

__all__ = [
    "CHECKPOINT_INTERVAL_S",
    "HW_CHECKPOINT_FILE",
    "read_hw_checkpoint",
    "write_hw_checkpoint",
]

log = logging.getLogger(__name__)

#: The checkpoint's file name in the data directory (Kafka's name for the same file).
HW_CHECKPOINT_FILE = "replication-offset-checkpoint"
#: How often the checkpoint is written when a high watermark moved (Kafka's
#: ``replica.high.watermark.checkpoint.interval.ms`` is 5 s): what a crash can lose is the
#: last few seconds of progress, which only means serving a little less until the role comes.
CHECKPOINT_INTERVAL_S = 5.0


def _key_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def read_hw_checkpoint(fs: FileSystem, data_dir: str) -> dict[tuple[str, int], int]:
    """The high watermarks recorded in ``data_dir``'s checkpoint: ``{(topic, partition):
    offset}``; empty when there is none or it cannot be read (logged)."""
    path = f"{data_dir}/{HW_CHECKPOINT_FILE}"
    try:
        if not fs.exists(path):
            return {}
        data = json.loads(fs.read_file(path))
        if not isinstance(data, dict) or data.get("version") != 1:
            raise ValueError("unknown layout")
        marks = data["high_watermarks"]
        if not isinstance(marks, dict):
            raise ValueError("unknown layout")
        out: dict[tuple[str, int], int] = {}
        for name, offset in marks.items():
            topic, sep, partition = str(name).rpartition("-")
            if not sep or not topic or not partition.isdigit():
                raise ValueError(f"bad partition name {name!r}")
            value = int(offset)
            if value < 0:
                raise ValueError(f"negative high watermark for {name!r}")
            out[(topic, int(partition))] = value
        return out
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring unreadable high-watermark checkpoint %s: %s", path, exc)
        return {}


def write_hw_checkpoint(fs: FileSystem, data_dir: str, marks: dict[tuple[str, int], int]) -> None:
    """Replace ``data_dir``'s checkpoint with ``marks`` (atomically: a crash leaves the old
    one or the new one). Blocking: run it in a thread.

    Raises:
        OSError: the file could not be written (the old one is then unchanged).
    """
    doc = {
        "version": 1,
        "high_watermarks": {_key_name(t, p): hw for (t, p), hw in sorted(marks.items())},
    }
    write_atomic(fs, f"{data_dir}/{HW_CHECKPOINT_FILE}", json.dumps(doc).encode() + b"\n")
