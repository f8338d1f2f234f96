"""A broker and its TCP server in a process of their own, for tests that need the settings
``tidewire serve`` has no options for (frame and idle timeouts, connection and in-flight
bounds).

Run as ``python -m tests.server._serve_process DATA_DIR SERVER_CONFIG_JSON``: the JSON object
holds :class:`~tidewire.server.ServerConfig` fields. Topics are never created on a first
publish (a mutated topic name must not create one). With ``TIDEWIRE_TEST_NOFILE=N`` in the
environment the process first sets its descriptor limit (soft and hard) to N, as
``ulimit -n N`` would. The first line on stdout is
``listening on 127.0.0.1:PORT``; SIGTERM or SIGINT stops it cleanly. Warnings and errors go to
stderr.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
import signal
import sys

from tidewire.broker import Broker, BrokerConfig
from tidewire.server import ServerConfig, TcpServer

#: The environment variable of a descriptor limit to run under.
NOFILE_ENV = "TIDEWIRE_TEST_NOFILE"
#: How long in-flight requests may take to finish at the end (s).
STOP_GRACE_S = 5.0


async def serve(data_dir: str, server_config: ServerConfig) -> None:
    """Serve until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with Broker(BrokerConfig(data_dir, auto_create_topics=False)) as broker:
        server = TcpServer(broker, server_config)
        await server.start()
        print(f"listening on {server_config.host}:{server.port}", flush=True)
        await stop.wait()
        await server.close(grace_s=STOP_GRACE_S)


def main(argv: list[str]) -> None:
    data_dir, settings = argv
    if os.environ.get(NOFILE_ENV):
        limit = int(os.environ[NOFILE_ENV])
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    config = ServerConfig(**{"host": "127.0.0.1", "port": 0, **json.loads(settings)})
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    asyncio.run(serve(data_dir, config))


if __name__ == "__main__":
    main(sys.argv[1:])
