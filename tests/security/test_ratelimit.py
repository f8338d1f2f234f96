"""The failed-authentication limiter, on a fake clock: a burst of the limit, then one
attempt per 60/limit seconds; per source and per principal; what a success resets; and its
memory bound under a flood of distinct addresses."""

from __future__ import annotations

import tracemalloc

import pytest

from tidewire.security.ratelimit import FailureLimiter


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_allows_the_limit_then_blocks(clock: FakeClock) -> None:
    limiter = FailureLimiter(5, clock=clock)
    for _ in range(4):
        limiter.failed("10.0.0.1", "alice")
        assert limiter.blocked("10.0.0.1", "alice") == 0.0
    limiter.failed("10.0.0.1", "alice")
    # Full: one failure drains every 60 / 5 = 12 seconds.
    assert limiter.blocked("10.0.0.1", "alice") == pytest.approx(12.0)
    clock.now += 5.0
    assert limiter.blocked("10.0.0.1", "alice") == pytest.approx(7.0)


def test_waiting_the_answer_is_enough(clock: FakeClock) -> None:
    limiter = FailureLimiter(7, clock=clock)  # 60 / 7 is not exact in floating point
    for _ in range(30):
        limiter.failed("10.0.0.1", None)
    wait = limiter.blocked("10.0.0.1", None)
    assert wait == pytest.approx((30 - 7 + 1) * 60 / 7)
    clock.now += wait
    assert limiter.blocked("10.0.0.1", None) == 0.0
    limiter.failed("10.0.0.1", None)  # the attempt failed again: blocked for one interval
    assert limiter.blocked("10.0.0.1", None) == pytest.approx(60 / 7)


def test_sustained_rate_is_the_limit_per_minute(clock: FakeClock) -> None:
    limiter = FailureLimiter(20, clock=clock)
    attempts = 0
    start = clock.now
    while clock.now - start < 600.0:  # an attacker retrying as soon as allowed, 10 minutes
        wait = limiter.blocked("10.0.0.9", "root")
        if wait:
            clock.now += wait
            continue
        limiter.failed("10.0.0.9", "root")
        attempts += 1
    assert 20 * 10 <= attempts <= 20 * 10 + 20  # the limit per minute, plus the first burst


def test_per_source_limit_spans_principals(clock: FakeClock) -> None:
    limiter = FailureLimiter(3, clock=clock)
    for name in ("a", "b", "c"):
        limiter.failed("10.0.0.1", name)
    assert limiter.blocked("10.0.0.1", "d") > 0.0  # same address, fresh name: still blocked
    assert limiter.blocked("10.0.0.1", None) > 0.0
    assert limiter.blocked("10.0.0.2", "d") == 0.0


def test_per_principal_limit_spans_sources(clock: FakeClock) -> None:
    limiter = FailureLimiter(3, clock=clock)
    for source in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):
        limiter.failed(source, "alice")
    assert limiter.blocked("10.0.0.4", "alice") == pytest.approx(20.0)
    assert limiter.blocked("10.0.0.4", "bob") == 0.0
    assert limiter.blocked("10.0.0.4", None) == 0.0


def test_success_forgets_the_principal_not_the_source(clock: FakeClock) -> None:
    limiter = FailureLimiter(3, clock=clock)
    limiter.failed("10.0.0.1", "alice")
    limiter.failed("10.0.0.2", "alice")
    limiter.failed("10.0.0.1", "mallory")
    limiter.succeeded("10.0.0.1", "alice")
    limiter.failed("10.0.0.3", "alice")
    limiter.failed("10.0.0.4", "alice")
    assert limiter.blocked("10.0.0.5", "alice") == 0.0  # 2 failures since the success
    limiter.failed("10.0.0.1", "bob")
    assert limiter.blocked("10.0.0.1", None) > 0.0  # the source kept its 3 failures


def test_drained_buckets_are_forgotten(clock: FakeClock) -> None:
    limiter = FailureLimiter(60, clock=clock)  # drains one failure a second
    limiter.failed("10.0.0.1", "alice")
    assert len(limiter) == 2
    clock.now += 1.5
    limiter.failed("10.0.0.2", None)  # any call prunes drained entries at the old end
    assert len(limiter) == 1


def test_memory_bounded_with_a_million_sources(clock: FakeClock) -> None:
    limiter = FailureLimiter(20, clock=clock, max_keys=10_000)
    sources = [f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}" for i in range(1_000_000)]
    for source in sources:
        limiter.failed(source, None)
    assert len(limiter) == 10_000
    # The most recent are still counted; the oldest were forgotten.
    for _ in range(19):
        limiter.failed(sources[-1], None)
    assert limiter.blocked(sources[-1], None) > 0.0
    assert limiter.blocked(sources[0], None) == 0.0


def test_memory_bound_in_bytes(clock: FakeClock) -> None:
    names = [f"user-{i}" for i in range(30_000)]
    sources = [f"10.0.{i >> 8}.{i & 255}" for i in range(30_000)]
    tracemalloc.start()
    try:
        limiter = FailureLimiter(20, clock=clock, max_keys=1_000)
        for source, name in zip(sources, names, strict=True):
            limiter.failed(source, name)
        current, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(limiter) == 2_000
    assert current < 1_000_000  # 2,000 entries of a few hundred bytes, not 60,000


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="limit_per_minute=0 must be >= 1"):
        FailureLimiter(0)
    with pytest.raises(ValueError, match="max_keys=0 must be >= 1"):
        FailureLimiter(5, max_keys=0)


def test_attempts_under_way_count_as_failures(clock: FakeClock) -> None:
    # A check that takes time (scrypt in a thread): attempts sent at once must not all pass
    # the check before the first of them has failed.
    limiter = FailureLimiter(5, clock=clock)
    let_in = [limiter.begin("10.0.0.1", "alice") == 0.0 for _ in range(50)]
    assert let_in.count(True) == 5
    assert limiter.begin("10.0.0.2", "alice") > 0  # the principal's count too
    for _ in range(5):
        limiter.failed("10.0.0.1", "alice")  # each failed: counted before it ends
        limiter.end("10.0.0.1", "alice")
        assert limiter.blocked("10.0.0.1", "alice") == pytest.approx(12.0)
    # Nothing under way is left behind.
    assert limiter._pending_sources == {}
    assert limiter._pending_principals == {}


def test_an_attempt_that_succeeds_releases_its_place(clock: FakeClock) -> None:
    limiter = FailureLimiter(2, clock=clock)
    assert limiter.begin("10.0.0.1", "alice") == 0.0
    assert limiter.begin("10.0.0.1", "alice") == 0.0
    assert limiter.begin("10.0.0.1", "alice") > 0  # two under way: the limit
    limiter.end("10.0.0.1", "alice")
    limiter.succeeded("10.0.0.1", "alice")
    assert limiter.begin("10.0.0.1", "bob") == 0.0  # a place again
    limiter.end("10.0.0.1", "alice")
    limiter.end("10.0.0.1", "bob")
    assert limiter.blocked("10.0.0.1", "alice") == 0.0
