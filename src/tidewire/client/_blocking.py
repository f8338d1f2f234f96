"""What every blocking twin shares: an event loop in a daemon thread of its own, on which the
asyncio twin runs, and the calls that hand it coroutines and stop it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, ClassVar, Generic, Protocol, Self, TypeVar

from tidewire.errors import ConnectionLostError, TidewireError

__all__ = ["BlockingTwin"]

T = TypeVar("T")


class _Closable(Protocol):
    async def close(self) -> None: ...


A = TypeVar("A", bound=_Closable)


class BlockingTwin(Generic[A]):
    """Base of ``Client``, ``Producer``, ``Consumer`` and ``GroupConsumer``.

    A subclass calls :meth:`_start_loop` first in ``__init__`` (and :meth:`_stop_loop` if
    what follows fails), then every method is ``self._run(self._async.method(...))``.
    """

    #: The asyncio twin, made on the loop by the subclass's ``__init__``.
    _async: A
    #: What a call after close raises, and says.
    _closed_error: ClassVar[type[TidewireError]] = ConnectionLostError
    _closed_message: ClassVar[str] = "the client is closed"

    def _start_loop(self, thread_name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=thread_name, daemon=True
        )
        self._thread.start()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the twin's loop and wait for its result (or error)."""
        if self._loop.is_closed():
            coro.close()
            raise self._closed_error(self._closed_message)
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the asyncio twin, then stop the thread."""
        if self._loop.is_closed():
            return
        try:
            self._run(self._async.close())
        finally:
            self._stop_loop()
