"""The limit on failed authentications, per source address and per principal name.

Each source and each principal has a leaky bucket of failures: every failure adds one, the
bucket drains at ``limit_per_minute`` per 60 seconds, and a full bucket (``limit_per_minute``
failures) blocks further attempts until one failure has drained. That is the sliding form of
"at most N failures a minute": a burst of N, then one attempt every 60/N seconds for as long
as the failures go on, with no window edge to time a second burst against.

Both counts matter: the per-source one stops one address from guessing many principals'
keys, the per-principal one stops many addresses from guessing one principal's key.

A success forgets the principal's failures (the owner got in: earlier failures were most
likely their own typos, and should not lock them out after a later slip), but never the
source's: an attacker holding one valid key must not be able to wipe its address's count
between guesses at other principals.

An attempt whose check takes time (a whole key verified with scrypt, tens of milliseconds
in a thread) counts as a failure while it is under way (:meth:`FailureLimiter.begin` ..
:meth:`FailureLimiter.end`): otherwise every attempt that arrives before the first failure
is counted, however many an attacker pipelines on one connection or sends on many at once,
would pass the check and cost its scrypt. So at most ``limit_per_minute`` such checks run
per source, and per principal, however the attempts are sent.

Memory is bounded: at most ``max_keys`` sources and ``max_keys`` principals are tracked;
buckets that drained empty are dropped, and past the bound the least recently failed entry
is forgotten first. Every call is O(1) (amortized).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["FailureLimiter"]

#: The window the limit is expressed over, in seconds.
WINDOW_SECONDS = 60.0
#: Failures drained in floating point may land a hair above a whole number: a caller that
#: waited exactly the time it was told must be let in.
_ROUNDING = 1e-9


class _Buckets:
    """Leaky buckets by key, least recently filled first: key -> (level, time of level)."""

    def __init__(self, drain_per_second: float, max_keys: int) -> None:
        self._drain = drain_per_second
        self._max_keys = max_keys
        self._levels: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._levels)

    def level(self, key: str, now: float) -> float:
        """Failures still in ``key``'s bucket at ``now``."""
        entry = self._levels.get(key)
        if entry is None:
            return 0.0
        level, since = entry
        return max(0.0, level - (now - since) * self._drain)

    def add(self, key: str, now: float) -> None:
        """One more failure for ``key``."""
        level = self.level(key, now) + 1.0
        self._levels[key] = (level, now)
        self._levels.move_to_end(key)

    def forget(self, key: str) -> None:
        self._levels.pop(key, None)

    def prune(self, now: float) -> None:
        """Drop drained buckets and enforce the bound."""
        # Drop drained buckets from the old end (each entry is dropped once: amortized O(1)),
        # then enforce the bound by forgetting the least recently failed.
        levels = self._levels
        while levels:
            key, (level, since) = next(iter(levels.items()))
            if len(levels) <= self._max_keys and level - (now - since) * self._drain > 0.0:
                break
            del levels[key]


class FailureLimiter:
    """Counts failed authentications per source address and per principal name, and says
    how long a new attempt must wait.

    Args:
        limit_per_minute: failures allowed per source, and per principal, in 60 seconds
            (a burst of this many, then this many per minute); >= 1.
        clock: monotonic seconds (injected so tests can move time).
        max_keys: the most sources, and the most principals, tracked at once; >= 1. An
            entry costs some 300 bytes with its key, so the default 100,000 bounds the
            limiter to about 60 MB under a flood of distinct addresses and names.

    Raises:
        ValueError: a limit or ``max_keys`` below 1.
    """

    def __init__(
        self,
        limit_per_minute: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 100_000,
    ) -> None:
        if limit_per_minute < 1:
            raise ValueError(f"limit_per_minute={limit_per_minute} must be >= 1")
        if max_keys < 1:
            raise ValueError(f"max_keys={max_keys} must be >= 1")
        self.limit_per_minute = limit_per_minute
        self._clock = clock
        self._drain = limit_per_minute / WINDOW_SECONDS
        self._sources = _Buckets(self._drain, max_keys)
        self._principals = _Buckets(self._drain, max_keys)
        #: Attempts under way (between begin and end), per source and per principal: each
        #: holds at most ``limit_per_minute`` (begin refuses beyond), and an entry lives only
        #: while its attempts do.
        self._pending_sources: dict[str, int] = {}
        self._pending_principals: dict[str, int] = {}

    def __len__(self) -> int:
        """Sources and principals tracked now (the limiter's memory, in entries)."""
        return len(self._sources) + len(self._principals)

    def blocked(self, source: str, principal: str | None) -> float:
        """Seconds until an attempt from ``source`` for ``principal`` is allowed again:
        0.0 when it is allowed now, else the longer wait of the two counts.

        Args:
            source: the client's address (an IP address, without the port).
            principal: the name the client authenticates as, or None when not yet known.
        """
        now = self._clock()
        level = self._sources.level(source, now) + self._pending_sources.get(source, 0)
        if principal is not None:
            level = max(
                level,
                self._principals.level(principal, now) + self._pending_principals.get(principal, 0),
            )
        # Allowed while the failure this attempt may add still fits in the bucket; else
        # wait until the fullest bucket drained that far.
        excess = level - (self.limit_per_minute - 1)
        return excess / self._drain if excess > _ROUNDING else 0.0

    def begin(self, source: str, principal: str | None) -> float:
        """Start an attempt whose check takes time: like :meth:`blocked`, and when that says
        0.0 the attempt counts as a failure until :meth:`end` (call :meth:`failed` before
        :meth:`end` when it failed, so the count never dips in between)."""
        wait = self.blocked(source, principal)
        if wait == 0.0:
            self._pending_sources[source] = self._pending_sources.get(source, 0) + 1
            if principal is not None:
                self._pending_principals[principal] = self._pending_principals.get(principal, 0) + 1
        return wait

    def end(self, source: str, principal: str | None) -> None:
        """The attempt :meth:`begin` let through is over."""
        _release(self._pending_sources, source)
        if principal is not None:
            _release(self._pending_principals, principal)

    def failed(self, source: str, principal: str | None) -> None:
        """Count one failed authentication from ``source`` (and for ``principal``, when
        known)."""
        now = self._clock()
        self._sources.add(source, now)
        if principal is not None:
            self._principals.add(principal, now)
        self._sources.prune(now)
        self._principals.prune(now)

    def succeeded(self, source: str, principal: str | None) -> None:
        """A successful authentication: forgets ``principal``'s failures, keeps the
        source's (see the module's docstring for why)."""
        if principal is not None:
            self._principals.forget(principal)


def _release(pending: dict[str, int], key: str) -> None:
    n = pending.get(key, 0) - 1
    if n > 0:
        pending[key] = n
    else:
        pending.pop(key, None)
