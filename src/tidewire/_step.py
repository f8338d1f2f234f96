"""Work put off to the end of the step that is running, on the thread running it.

A step is one callback of the event loop that settles many waiters at once: a group commit's
result taken back, or a turn's writes drained (:mod:`tidewire.storage.log`). Each waiter it
settles may make work that is cheaper done once for all of them, such as a connection's
answers sent in one write. :func:`defer` puts that work off to the end of the step; outside a
step it says so, and the caller does it some other way (the loop's next callback).

Per thread: an embedded broker's loop may run in a thread of its own, beside another's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["active", "begin", "defer", "end"]

log = logging.getLogger("tidewire.step")


class _Steps(threading.local):
    #: What runs at the end of the step running on this thread; None outside a step.
    after: list[Callable[[], None]] | None = None


_steps = _Steps()


def begin() -> bool:
    """Start a step on this thread. False if one is running already (a step inside another:
    the outer one runs what is put off, and the caller must not call :func:`end`)."""
    if _steps.after is not None:
        return False
    _steps.after = []
    return True


def end() -> None:
    """End the step :func:`begin` started: run what was put off in it, in order. What one
    function puts off in turn runs too; a failure is logged and the rest still run."""
    after = _steps.after or []
    try:
        i = 0
        while i < len(after):  # what runs may put off more: it runs too
            try:
                after[i]()
            except Exception:
                log.exception("work put off to the end of a step failed")
            i += 1
    finally:
        _steps.after = None


def defer(fn: Callable[[], None]) -> bool:
    """Run ``fn`` at the end of the step running on this thread, once however often it is
    put off in the step (functions compared with ``==``: a bound method is the same each
    time). False if no step is running (``fn`` is not kept)."""
    after = _steps.after
    if after is None:
        return False
    if fn not in after:
        after.append(fn)
    return True


def active() -> bool:
    """Whether a step is running on this thread (what is put off waits for its end)."""
    return _steps.after is not None
