"""Fixtures of the Spark tests: one local SparkSession for the whole test session and one
broker its Python workers reach over TCP.

Every test under tests/spark is marked ``spark`` (deselect them with ``-m 'not spark'``).
The session runs ``local[2,3]``: two cores, and a failed task is retried up to three times
(plain ``local[2]`` never retries), so the tests see what a cluster does after a failure.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tidewire.embedded import EmbeddedBroker

T = TypeVar("T")

#: How long starting or stopping the broker's thread may take (s).
BROKER_THREAD_TIMEOUT_S = 60.0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.spark)


class BrokerThread:
    """An :class:`EmbeddedBroker` on an event loop in a thread of its own, with a way to run
    code on that loop (the broker's state belongs to it)."""

    def __init__(self, data_dir: Path) -> None:
        self.eb = EmbeddedBroker(str(data_dir), default_partitions=1)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="spark-tests broker", daemon=True
        )

    @property
    def addr(self) -> str:
        return self.eb.addr

    def start(self) -> None:
        self._thread.start()
        self.run(self.eb.start())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the broker's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(BROKER_THREAD_TIMEOUT_S)

    def call(self, fn: Callable[[], T]) -> T:
        """Call ``fn`` on the broker's loop (for the broker core's synchronous methods)."""

        async def call() -> T:
            return fn()

        return self.run(call())

    def stop(self) -> None:
        try:
            self.run(self.eb.close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(BROKER_THREAD_TIMEOUT_S)
            self.loop.close()


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerThread]:
    """One broker for every Spark test (each test uses topics of its own)."""
    b = BrokerThread(tmp_path_factory.mktemp("spark-broker"))
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The one local SparkSession of the test session (starting one takes seconds)."""
    # The Python workers must run this interpreter (the one tidewire is installed in), not
    # whatever python3 is first on PATH.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # everything on the loopback
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2,3]")
        .appName("tidewire-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
