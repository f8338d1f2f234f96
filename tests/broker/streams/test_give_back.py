"""Memory given back after most streams are forgotten: the index's table made anew and the C
heap's free pages returned to the system (glibc's malloc_trim), once per large eviction."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from tests.broker.streams._support import FakeClock, streams_broker
from tidewire import _memory
from tidewire.broker.streams import manager as manager_module
from tidewire.broker.streams.model import SendItem


def _evicting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int, keep: int) -> list[str]:
    """Sends to ``n + keep`` streams, takes the ``n`` first, lets them go idle and tick:
    the reasons the manager gave for giving memory back."""
    reasons: list[str] = []
    monkeypatch.setattr(manager_module, "GIVE_BACK_AFTER", 50)
    monkeypatch.setattr(manager_module, "give_back_in_thread", reasons.append)

    async def main() -> None:
        clock = FakeClock()
        async with streams_broker(tmp_path, clock, stream_idle_ms=10_000) as (_, st):
            await st.send([SendItem(f"s{i}", b"x" * 600) for i in range(n + keep)])
            taken = await st.receive([f"s{i}" for i in range(n)], max_messages=n)
            assert len(taken) == n
            table = st._streams
            clock.advance(11_000)
            st.tick()
            assert st.stats().streams == keep
            assert st.stats().evicted == n
            assert (st._streams is not table) == bool(reasons)  # made anew when given back
            assert sorted(st._streams) == sorted(f"s{i}" for i in range(n, n + keep))
            clock.advance(11_000)
            st.tick()  # nothing more forgotten: nothing more given back

    asyncio.run(main())
    return reasons


def test_memory_is_given_back_once_most_streams_are_forgotten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _evicting(tmp_path, monkeypatch, n=60, keep=10) == ["60 streams forgotten, 10 left"]


def test_memory_is_not_given_back_for_few_or_while_most_remain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _evicting(tmp_path, monkeypatch, n=40, keep=0) == []  # fewer than 50
    assert _evicting(tmp_path / "2", monkeypatch, n=60, keep=70) == []  # most remain


def _rss_anon() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


@pytest.mark.skipif(_memory._malloc_trim() is None, reason="the C library is not glibc")
def test_give_back_returns_freed_heap_pages_to_the_system() -> None:
    # 150,000 objects of 600 bytes each come from malloc (CPython's own allocator takes up
    # to 512); one allocated after them pins the heap's top, so freeing them alone gives
    # nothing back: glibc keeps the pages for reuse.
    blocks = [bytes(600) + i.to_bytes(4, "big") for i in range(150_000)]
    pin = bytes(600)
    del blocks
    before = _rss_anon()
    assert _memory.give_back()
    after = _rss_anon()
    assert before - after > 40 << 20, f"RssAnon {before >> 20} MiB -> {after >> 20} MiB"
    del pin


def test_give_back_in_thread_runs_off_the_calling_thread() -> None:
    t = _memory.give_back_in_thread("a test")
    if _memory._malloc_trim() is None:
        assert t is None
        return
    assert t is not None
    assert t is not threading.current_thread()
    t.join(30)
    assert not t.is_alive()
