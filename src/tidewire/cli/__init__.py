"""The ``tidewire`` command.

Today: ``tidewire serve`` runs a broker (the storage engine, the broker core and the TCP server
of the binary protocol) until SIGTERM or SIGINT, then drains: it stops accepting, lets
in-flight requests finish, flushes every log and writes the clean-shutdown marker.
``tidewire --version`` prints the version.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Annotated

import typer

from tidewire import __version__
from tidewire.broker import Broker, BrokerConfig
from tidewire.errors import TidewireError
from tidewire.server import ServerConfig, TcpServer
from tidewire.storage import FsyncPolicy, LogConfig

__all__ = ["app", "main"]

app = typer.Typer(
    name="tidewire",
    help="tidewire: a pub/sub message broker with partitioned, durable topics.",
    no_args_is_help=True,
    add_completion=False,
)

log = logging.getLogger("tidewire")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"tidewire {__version__}")
        raise typer.Exit


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """tidewire: a pub/sub message broker with partitioned, durable topics."""


@app.command()
def serve(
    data_dir: Annotated[
        Path, typer.Option("--data-dir", help="Where the logs live (created if missing).")
    ] = Path("./tidewire-data"),
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(help="TCP port of the binary protocol (0: any free).")
    ] = 7400,
    fsync: Annotated[
        FsyncPolicy,
        typer.Option(
            help="Durability of new topics: always (ack after fsync, group commit), "
            "interval (fsync every --flush-interval-ms), never."
        ),
    ] = FsyncPolicy.INTERVAL,
    flush_interval_ms: Annotated[
        int, typer.Option(help="fsync period under --fsync interval (ms).")
    ] = 50,
    partitions: Annotated[
        int, typer.Option(help="Partitions of a topic created without a count.")
    ] = 1,
    auto_create: Annotated[bool, typer.Option(help="Create a topic on its first publish.")] = True,
) -> None:
    """Run a broker until SIGTERM or SIGINT, then drain and stop cleanly."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = BrokerConfig(
            str(data_dir),
            default_partitions=partitions,
            auto_create_topics=auto_create,
            log=LogConfig(fsync=fsync, flush_interval_ms=flush_interval_ms),
        )
    except TidewireError as exc:
        raise typer.BadParameter(exc.message) from None
    try:
        asyncio.run(_serve(config, ServerConfig(host=host, port=port)))
    except TidewireError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(1) from None
    except OSError as exc:
        typer.echo(f"error: cannot listen on {host}:{port}: {exc.strerror}", err=True)
        raise typer.Exit(1) from None


async def _serve(config: BrokerConfig, server_config: ServerConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with Broker(config) as broker:
        server = TcpServer(broker, server_config)
        await server.start()
        # One line for people and scripts alike: where to connect.
        typer.echo(f"tidewire {__version__} listening on {server_config.host}:{server.port}")
        await stop.wait()
        log.info("draining: no new connections, finishing in-flight requests")
        await server.close()
    log.info("stopped cleanly")


def main() -> None:
    """Entry point of the ``tidewire`` command."""
    app()
