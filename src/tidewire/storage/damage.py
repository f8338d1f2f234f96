"""Damaged ranges of a partition log: what one is, and its record beside the log.

A :class:`Damage` is a range of a log whose bytes failed their checks (see
:mod:`tidewire.storage.log`): never served, listed until retention, a truncation or the
operator removes it. The ranges of a partition are recorded in its :data:`DAMAGE_FILE`
(JSON, written atomically) so that a restart reports them before anything reads them again::

    {"version": 1, "ranges": [{"start": 5, "end": 6, "file": "00000000000000000000.log",
      "position": 805, "end_position": 966, "reason": "CRC-32C mismatch ...",
      "quarantined": null}]}

A quarantined range's bytes are copied to ``<start>-<end>.quarantined`` (20 digits each) in the
partition directory by :func:`copy_to_quarantine`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tidewire.storage.fs import FileHandle, FileSystem, write_atomic

__all__ = [
    "DAMAGE_FILE",
    "Damage",
    "copy_to_quarantine",
    "quarantine_name",
    "read_damage_file",
    "write_damage_file",
]

#: The partition directory's record of its damaged ranges.
DAMAGE_FILE = "damage.json"
#: Bytes copied at a time when a damaged range is quarantined.
_COPY_CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Damage:
    """A range of a log whose bytes failed their checks: never served.

    Attributes:
        start: the first offset of the range.
        end: the first offset after it (where reading can go on).
        path: the segment ``.log`` file holding the damaged bytes.
        position: the byte of that file where the damage starts.
        end_position: the byte after it (``position`` for a range of offsets with no bytes:
            a gap between segments).
        reason: the first check that failed.
        quarantined: the file beside the log holding a copy of the damaged bytes, once an
            operator quarantined the range (it is then read past as a gap), else ``None``.
    """

    start: int
    end: int
    path: str
    position: int
    end_position: int
    reason: str
    quarantined: str | None = None

    @property
    def size(self) -> int:
        """Damaged bytes."""
        return self.end_position - self.position

    @property
    def offset(self) -> int:
        """The first offset of the range (:attr:`start`)."""
        return self.start


def write_damage_file(fs: FileSystem, directory: str, ranges: list[Damage]) -> None:
    """Record ``ranges`` in ``directory``'s :data:`DAMAGE_FILE` (removed when empty).

    Raises:
        OSError: the file could not be written or removed.
    """
    path = f"{directory}/{DAMAGE_FILE}"
    if not ranges:
        if fs.exists(path):
            fs.remove(path)
        return
    doc = {
        "version": 1,
        "ranges": [
            {
                "start": d.start,
                "end": d.end,
                "file": d.path.rsplit("/", 1)[-1],
                "position": d.position,
                "end_position": d.end_position,
                "reason": d.reason,
                "quarantined": d.quarantined,
            }
            for d in ranges
        ],
    }
    write_atomic(fs, path, json.dumps(doc, indent=2).encode() + b"\n")


def read_damage_file(fs: FileSystem, directory: str) -> list[Damage]:
    """The ranges recorded in ``directory``'s :data:`DAMAGE_FILE` (none if it is missing).

    Raises:
        ValueError: the file is not a damage record this version reads.
        OSError: it could not be read.
    """
    path = f"{directory}/{DAMAGE_FILE}"
    if not fs.exists(path):
        return []
    try:
        data = json.loads(fs.read_file(path))
        if data.get("version") != 1:
            raise ValueError(f"unknown version {data.get('version')!r}")
        return [
            Damage(
                int(r["start"]),
                int(r["end"]),
                f"{directory}/{r['file']}",
                int(r["position"]),
                int(r["end_position"]),
                str(r["reason"]),
                None if r.get("quarantined") is None else str(r["quarantined"]),
            )
            for r in data["ranges"]
        ]
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: {exc!r}") from None


def quarantine_name(d: Damage) -> str:
    """The file name a quarantined copy of ``d``'s bytes gets."""
    return f"{d.start:020d}-{d.end:020d}.quarantined"


def copy_to_quarantine(fs: FileSystem, source: FileHandle | None, d: Damage, path: str) -> None:
    """Copy ``d``'s bytes from its segment's open file ``source`` (``None``: a range with no
    bytes) to ``path``: written to ``path.tmp``, fsynced, renamed, the directory fsynced.

    Raises:
        OSError: a step failed (``path`` then does not exist, or is complete).
    """
    tmp = f"{path}.tmp"
    out = fs.open(tmp, create=True)
    try:
        out.truncate(0)
        at = d.position
        while source is not None and at < d.end_position:
            chunk = source.pread(min(_COPY_CHUNK, d.end_position - at), at)
            if not chunk:
                break
            out.pwritev([chunk], at - d.position)
            at += len(chunk)
        out.sync()
    finally:
        out.close()
    fs.rename(tmp, path)
    fs.sync_dir(path.rsplit("/", 1)[0])
