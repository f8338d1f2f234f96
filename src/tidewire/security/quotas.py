"""Per-principal quotas on produce bytes, fetch bytes and requests per second, in Kafka's
model: the broker never refuses a request over quota, it answers it late.

Each principal's use of each kind is measured as a rate over a window of ``samples``
samples of ``sample_seconds`` each (by default 11 one-second samples, as Kafka). When a
request takes the rate above the limit, the answer is delayed by the time that brings the
average over the window back to the limit::

    delay = (rate - limit) / limit * window        (= total / limit - window)

capped at ``max_throttle_seconds``. The broker holds the answer that long and reports the
delay in it; a client that honours it waits as long before its next request, so the rate
it gets converges on the limit. As in Kafka, the window is never counted as shorter than
``samples - 1`` samples, so a principal's first second may burst up to ten times its limit
before it is throttled, instead of being throttled on its very first large request.

The average a client gets converges on its limit within a few percent while each request
carries at most a second or two of its quota; when every request carries several seconds'
worth, the coarse samples let through up to about a fifth more.

Limits come from a default and per-principal overrides; an override replaces the default
as a whole (a 0 in it means "no quota" for that principal, even where the default has one).
A principal's measurements are forgotten after ``idle_seconds`` without traffic (with its
throttle counter), and at most ``max_principals`` are tracked, least recently active
forgotten first. Kinds without a limit are not measured at all.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from tidewire.errors import InvalidConfigError

__all__ = ["KINDS", "Kind", "QuotaLimits", "Quotas"]

Kind = Literal["produce", "fetch", "request"]
#: The quota kinds, as they appear in :meth:`Quotas.throttle_seconds_total`.
KINDS: tuple[Kind, ...] = ("produce", "fetch", "request")


@dataclass(frozen=True, slots=True)
class QuotaLimits:
    """The limits of one principal, or the default of all; 0 means no quota.

    Attributes:
        produce_bytes_per_s: bytes of record batches published per second.
        fetch_bytes_per_s: bytes of record batches fetched per second.
        requests_per_s: requests of any kind per second.

    Raises:
        InvalidConfigError: a negative limit.
    """

    produce_bytes_per_s: int = 0
    fetch_bytes_per_s: int = 0
    requests_per_s: int = 0

    def __post_init__(self) -> None:
        for name in ("produce_bytes_per_s", "fetch_bytes_per_s", "requests_per_s"):
            value = getattr(self, name)
            if value < 0:
                raise InvalidConfigError(f"{name}={value} must be >= 0 (0: no quota)")

    def of(self, kind: Kind) -> int:
        """The limit of ``kind`` (0: none)."""
        if kind == "produce":
            return self.produce_bytes_per_s
        if kind == "fetch":
            return self.fetch_bytes_per_s
        return self.requests_per_s


class _Rate:
    """Kafka's sampled rate: totals of aligned samples, the last ``samples`` of them kept."""

    __slots__ = ("_samples", "_totals", "_width")

    def __init__(self, samples: int, width: float) -> None:
        self._samples = samples
        self._width = width
        self._totals: deque[list[float]] = deque()  # [sample number, total], oldest first

    def record(self, value: float, now: float) -> None:
        sample = math.floor(now / self._width)
        if self._totals and self._totals[-1][0] == sample:
            self._totals[-1][1] += value
        else:
            self._totals.append([sample, value])
        self._purge(sample)

    def _purge(self, sample: int) -> None:
        while self._totals and self._totals[0][0] <= sample - self._samples:
            self._totals.popleft()

    def measure(self, now: float) -> tuple[float, float]:
        """(total over the window, window in seconds), the window as Kafka's
        ``Rate.windowSize``: from the oldest sample's start, at least ``samples - 1`` whole
        samples long."""
        sample = math.floor(now / self._width)
        self._purge(sample)
        oldest = self._totals[0][0] if self._totals else sample
        elapsed = now - oldest * self._width
        full = int(elapsed // self._width)
        if full < self._samples - 1:
            elapsed += (self._samples - 1 - full) * self._width
        return sum(total for _, total in self._totals), elapsed


@dataclass(slots=True)
class _Usage:
    """One principal's rates (only of kinds with a limit) and throttle counters."""

    last_seen: float
    rates: dict[Kind, _Rate] = field(default_factory=dict)
    throttled: dict[Kind, float] = field(default_factory=dict)


class Quotas:
    """Measures each principal's produce bytes, fetch bytes and requests against its limits
    and says how long to delay each answer.

    Args:
        default: the limits of every principal without an override.
        clock: monotonic seconds (injected so tests can move time).
        samples: samples in the measuring window (Kafka: 11); >= 2.
        sample_seconds: length of one sample (Kafka: 1 s); > 0.
        max_throttle_seconds: the longest delay ever asked (a burst after a long silence
            must not stall a client for minutes); > 0.
        idle_seconds: a principal without traffic this long is forgotten; >= the window.
        max_principals: the most principals measured at once (some 1-2 KB each); >= 1.

    Raises:
        InvalidConfigError: an argument out of its range.
    """

    def __init__(
        self,
        default: QuotaLimits,
        *,
        clock: Callable[[], float] = time.monotonic,
        samples: int = 11,
        sample_seconds: float = 1.0,
        max_throttle_seconds: float = 30.0,
        idle_seconds: float = 3600.0,
        max_principals: int = 100_000,
    ) -> None:
        checks = [
            (samples >= 2, f"samples={samples} must be >= 2"),
            (sample_seconds > 0, f"sample_seconds={sample_seconds} must be > 0"),
            (max_throttle_seconds > 0, f"max_throttle_seconds={max_throttle_seconds} must be > 0"),
            (
                idle_seconds >= samples * sample_seconds,
                f"idle_seconds={idle_seconds:g} must be >= the window of "
                f"{samples * sample_seconds:g} seconds ({samples} samples of {sample_seconds:g} s)",
            ),
            (max_principals >= 1, f"max_principals={max_principals} must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidConfigError(message)
        self.default = default
        self._clock = clock
        self._samples = samples
        self._sample_seconds = sample_seconds
        self._max_throttle = max_throttle_seconds
        self._idle = idle_seconds
        self._max_principals = max_principals
        self._overrides: dict[str, QuotaLimits] = {}
        self._usage: OrderedDict[str, _Usage] = OrderedDict()

    # --- limits ---------------------------------------------------------------------------------

    def set(self, principal: str, limits: QuotaLimits) -> None:
        """Give ``principal`` its own limits, replacing the default as a whole."""
        self._overrides[principal] = limits

    def clear(self, principal: str) -> None:
        """Remove ``principal``'s own limits: the default applies again."""
        self._overrides.pop(principal, None)

    def limits_of(self, principal: str) -> QuotaLimits:
        """The limits that apply to ``principal``: its own, else the default."""
        return self._overrides.get(principal, self.default)

    # --- recording ------------------------------------------------------------------------------

    def record_produce(self, principal: str, nbytes: int) -> float:
        """Count ``nbytes`` published by ``principal``; return the delay, in seconds, to
        apply before answering (0.0 under quota)."""
        return self._record(principal, "produce", nbytes)

    def record_fetch(self, principal: str, nbytes: int) -> float:
        """Count ``nbytes`` fetched by ``principal``; return the delay, in seconds."""
        return self._record(principal, "fetch", nbytes)

    def record_request(self, principal: str) -> float:
        """Count one request of ``principal``; return the delay, in seconds."""
        return self._record(principal, "request", 1)

    def _record(self, principal: str, kind: Kind, amount: int) -> float:
        if amount < 0:
            raise ValueError(f"a {kind} amount of {amount} is negative")
        limit = self.limits_of(principal).of(kind)
        if not limit:
            return 0.0
        now = self._clock()
        usage = self._usage.get(principal)
        if usage is None:
            usage = self._usage[principal] = _Usage(now)
        else:
            usage.last_seen = now
            self._usage.move_to_end(principal)
        rate = usage.rates.get(kind)
        if rate is None:
            rate = usage.rates[kind] = _Rate(self._samples, self._sample_seconds)
        rate.record(amount, now)
        total, window = rate.measure(now)
        delay = 0.0
        if total > limit * window:  # the rate total / window is over the limit
            delay = min(total / limit - window, self._max_throttle)
            usage.throttled[kind] = usage.throttled.get(kind, 0.0) + delay
        self._forget_idle(now)
        return delay

    def _forget_idle(self, now: float) -> None:
        usage = self._usage
        while usage:
            principal, oldest = next(iter(usage.items()))
            if len(usage) <= self._max_principals and now - oldest.last_seen < self._idle:
                break
            del usage[principal]

    # --- metrics --------------------------------------------------------------------------------

    def rate_of(self, principal: str, kind: Kind) -> float:
        """``principal``'s current rate of ``kind`` per second, as measured for its quota
        (0.0 when not measured: no limit, or no recent traffic)."""
        usage = self._usage.get(principal)
        rate = usage.rates.get(kind) if usage is not None else None
        if rate is None:
            return 0.0
        total, window = rate.measure(self._clock())
        return total / window

    def throttle_seconds_total(self) -> dict[tuple[str, Kind], float]:
        """A snapshot of the delay asked so far, in seconds, by (principal, kind), for the
        principals still tracked: a counter, reset when a principal is forgotten."""
        return {
            (principal, kind): seconds
            for principal, usage in self._usage.items()
            for kind, seconds in usage.throttled.items()
        }

    def __len__(self) -> int:
        """Principals tracked now."""
        return len(self._usage)
