"""Per-log configuration, validated on construction."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from typing import Any

from tidewire.errors import InvalidConfigError

__all__ = ["FsyncPolicy", "LogConfig"]


class FsyncPolicy(enum.StrEnum):
    """When appended batches are made durable.

    ``ALWAYS``: an append is acknowledged only after an fsync that covers it; concurrent
    appends share one fsync (group commit). ``INTERVAL``: acknowledged once written to the OS;
    fsync every ``flush_interval_ms``; a power cut loses at most that window. ``NEVER``: the OS
    decides when to write; only a clean close fsyncs.
    """

    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Settings of one partition log.

    Attributes:
        segment_bytes: roll to a new segment when the active one would exceed this (bytes).
        segment_ms: roll when the active segment's first append is older than this (ms).
        retention_ms: delete whole segments whose newest record is older (ms); -1: keep.
        retention_bytes: delete oldest segments while the log exceeds this (bytes); -1: keep.
        fsync: the durability policy.
        flush_interval_ms: fsync period under ``FsyncPolicy.INTERVAL`` (ms).
        index_interval_bytes: bytes between two sparse index entries.
        max_batch_bytes: the largest batch an append accepts (bytes).
        max_pending_appends: appends awaiting their fsync at once under ``ALWAYS``; beyond,
            :class:`~tidewire.errors.BackpressureError`.
    """

    segment_bytes: int = 1024 * 1024 * 1024
    segment_ms: int = 7 * 24 * 3600 * 1000
    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = -1
    fsync: FsyncPolicy = FsyncPolicy.INTERVAL
    flush_interval_ms: int = 50
    index_interval_bytes: int = 4096
    max_batch_bytes: int = 16 * 1024 * 1024
    max_pending_appends: int = 65536

    def __post_init__(self) -> None:
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise InvalidConfigError(what)

        # Index positions are stored as 32-bit unsigned integers: a segment stays below 2 GiB.
        need(
            1024 <= self.segment_bytes <= 2**31 - 1,
            f"segment_bytes={self.segment_bytes:,} must be within 1,024..2,147,483,647",
        )
        need(self.segment_ms >= 1, f"segment_ms={self.segment_ms} must be >= 1")
        need(
            self.retention_ms == -1 or self.retention_ms >= 0,
            f"retention_ms={self.retention_ms} must be -1 (keep forever) or >= 0",
        )
        need(
            self.retention_bytes == -1 or self.retention_bytes >= 0,
            f"retention_bytes={self.retention_bytes} must be -1 (keep forever) or >= 0",
        )
        need(
            isinstance(self.fsync, FsyncPolicy),
            f"fsync={self.fsync!r} must be one of always, interval, never",
        )
        need(
            1 <= self.flush_interval_ms <= 3_600_000,
            f"flush_interval_ms={self.flush_interval_ms} must be within 1..3,600,000",
        )
        need(
            64 <= self.index_interval_bytes <= 16 * 1024 * 1024,
            f"index_interval_bytes={self.index_interval_bytes} must be within 64..16,777,216",
        )
        # A batch larger than segment_bytes gets a segment of its own, as in Kafka.
        need(
            61 <= self.max_batch_bytes <= 256 * 1024 * 1024,
            f"max_batch_bytes={self.max_batch_bytes:,} must be within 61..268,435,456",
        )
        need(self.max_pending_appends >= 1, "max_pending_appends must be >= 1")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        d = asdict(self)
        d["fsync"] = str(self.fsync)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LogConfig:
        """Build from a dict such as :meth:`to_dict` returns; unknown keys are an error.

        Raises:
            InvalidConfigError: an unknown key, a wrong type or a value out of range.
        """
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise InvalidConfigError(f"unknown log setting(s): {', '.join(sorted(unknown))}")
        values = dict(data)
        if "fsync" in values:
            try:
                values["fsync"] = FsyncPolicy(values["fsync"])
            except ValueError:
                raise InvalidConfigError(
                    f"fsync={values['fsync']!r} must be one of always, interval, never"
                ) from None
        for k, v in values.items():
            if k != "fsync" and (not isinstance(v, int) or isinstance(v, bool)):
                raise InvalidConfigError(f"{k} must be an integer, got {type(v).__name__}")
        return cls(**values)
