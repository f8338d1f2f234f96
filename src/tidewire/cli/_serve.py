"""``tidewire serve`` and ``tidewire config``: run a broker with settings from a TOML file,
``TIDEWIRE_*`` environment variables and flags (see :mod:`tidewire.config`), and write the
default configuration file."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Annotated

import typer

from tidewire import __version__
from tidewire.broker import Broker
from tidewire.config import (
    SECTIONS,
    SETTINGS,
    Settings,
    default_toml,
    load_settings,
    toml_value,
    unknown_env_vars,
)
from tidewire.errors import InvalidConfigError, TidewireError
from tidewire.server import TcpServer
from tidewire.server.tcp import loop_factory
from tidewire.storage import FsyncPolicy

from ._common import EXIT_USAGE, echo_json, fail

__all__ = ["config_app", "serve"]

log = logging.getLogger("tidewire")

config_app = typer.Typer(
    name="config",
    help="The configuration file of tidewire serve.",
    no_args_is_help=True,
)

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        envvar="TIDEWIRE_CONFIG",
        show_envvar=True,
        help="A TOML configuration file (see: tidewire config init).",
        dir_okay=False,
    ),
]


def serve(
    config: ConfigOption = None,
    data_dir: Annotated[
        Path | None,
        typer.Option("--data-dir", help="Where the logs live (created if missing)."),
    ] = None,
    default_partitions: Annotated[
        int | None,
        typer.Option(
            "--partitions",
            help="Partitions of a topic created without a count.",
        ),
    ] = None,
    auto_create_topics: Annotated[
        bool | None,
        typer.Option(
            "--auto-create/--no-auto-create",
            help="Create a topic on its first publish.",
            show_default=False,
        ),
    ] = None,
    max_fetch_waiters: Annotated[
        int | None, typer.Option(help="Long-poll fetches waiting at once.")
    ] = None,
    max_wait_ms: Annotated[
        int | None, typer.Option(help="The longest a fetch may wait for data (ms).")
    ] = None,
    max_open_files: Annotated[
        int | None,
        typer.Option(help="Log files kept open at once (0: from the descriptor limit)."),
    ] = None,
    max_partitions: Annotated[
        int | None, typer.Option(help="Partitions of all topics together.")
    ] = None,
    fetch_max_bytes: Annotated[
        int | None, typer.Option(help="The most data one fetch answer carries (bytes).")
    ] = None,
    fsync: Annotated[
        FsyncPolicy | None,
        typer.Option(
            help="Durability of new topics: always (ack after fsync, group commit), "
            "interval (fsync every --flush-interval-ms), never."
        ),
    ] = None,
    flush_interval_ms: Annotated[
        int | None, typer.Option(help="fsync period under --fsync interval (ms).")
    ] = None,
    segment_bytes: Annotated[int | None, typer.Option(help="Segment size of new topics.")] = None,
    segment_ms: Annotated[int | None, typer.Option(help="Segment age of new topics (ms).")] = None,
    retention_ms: Annotated[
        int | None, typer.Option(help="Retention by age of new topics (ms; -1: keep).")
    ] = None,
    retention_bytes: Annotated[
        int | None, typer.Option(help="Retention by size of new topics (bytes; -1: keep).")
    ] = None,
    max_batch_bytes: Annotated[
        int | None, typer.Option(help="The largest record batch new topics accept.")
    ] = None,
    host: Annotated[str | None, typer.Option(help="Address to listen on.")] = None,
    port: Annotated[
        int | None, typer.Option(help="TCP port of the binary protocol (0: any free).")
    ] = None,
    max_connections: Annotated[int | None, typer.Option(help="Client connections at once.")] = None,
    max_frame_bytes: Annotated[
        int | None, typer.Option(help="The longest protocol frame accepted.")
    ] = None,
    max_in_flight: Annotated[
        int | None, typer.Option(help="Requests per connection before reads pause.")
    ] = None,
    max_unsent_bytes: Annotated[
        int | None,
        typer.Option(help="Per connection: bytes of fetch answers unsent before fetches wait."),
    ] = None,
    idle_timeout_s: Annotated[
        float | None, typer.Option(help="Close a connection silent for this long (s).")
    ] = None,
    frame_timeout_s: Annotated[
        float | None, typer.Option(help="Close a connection whose frame takes this long (s).")
    ] = None,
    event_loop: Annotated[
        str | None, typer.Option(help="auto (uvloop when installed), asyncio or uvloop.")
    ] = None,
    http_host: Annotated[str | None, typer.Option(help="Address the HTTP listeners bind.")] = None,
    http_port: Annotated[
        int | None,
        typer.Option(help="Port of the HTTP API (-1: off, the default; 0: any free)."),
    ] = None,
    http_max_body_bytes: Annotated[
        int | None, typer.Option(help="The longest HTTP request body accepted.")
    ] = None,
    http_msgbus_port: Annotated[
        int | None, typer.Option(help="Port of the msgbus-compatible HTTP API (-1: off).")
    ] = None,
    http_ipubsub_port: Annotated[
        int | None, typer.Option(help="Port of the iPubSub-compatible HTTP API (-1: off).")
    ] = None,
) -> None:
    """Run a broker until SIGTERM or SIGINT, then drain and stop cleanly.

    Settings come from the defaults, then --config FILE, then TIDEWIRE_* environment
    variables, then these flags (each wins over the ones before).
    """
    flags: dict[str, object] = {
        "data_dir": None if data_dir is None else str(data_dir),
        "default_partitions": default_partitions,
        "auto_create_topics": auto_create_topics,
        "max_fetch_waiters": max_fetch_waiters,
        "max_wait_ms": max_wait_ms,
        "max_open_files": max_open_files,
        "max_partitions": max_partitions,
        "fetch_max_bytes": fetch_max_bytes,
        "fsync": fsync,
        "flush_interval_ms": flush_interval_ms,
        "segment_bytes": segment_bytes,
        "segment_ms": segment_ms,
        "retention_ms": retention_ms,
        "retention_bytes": retention_bytes,
        "max_batch_bytes": max_batch_bytes,
        "host": host,
        "port": port,
        "max_connections": max_connections,
        "max_frame_bytes": max_frame_bytes,
        "max_in_flight": max_in_flight,
        "max_unsent_bytes": max_unsent_bytes,
        "idle_timeout_s": idle_timeout_s,
        "frame_timeout_s": frame_timeout_s,
        "event_loop": event_loop,
        "http_host": http_host,
        "http_port": http_port,
        "http_max_body_bytes": http_max_body_bytes,
        "http_msgbus_port": http_msgbus_port,
        "http_ipubsub_port": http_ipubsub_port,
    }
    try:
        settings = load_settings(config, flags=flags)
    except InvalidConfigError as exc:
        fail(exc.message, EXIT_USAGE)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for name in unknown_env_vars():
        log.warning("ignoring environment variable %s: no setting of that name", name)
    server = settings.server
    name, factory = loop_factory(server.event_loop)  # the setting was checked: cannot fail
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(_serve(settings, name))
    except TidewireError as exc:
        fail(exc.message)
    except OSError as exc:
        fail(f"cannot listen on {server.host}:{server.port}: {exc.strerror}")


async def _serve(settings: Settings, loop_name: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with Broker(settings.broker) as broker:
        server = TcpServer(broker, settings.server)
        await server.start()
        gateway = None
        if settings.http.enabled:
            # Imported here: FastAPI and uvicorn load only when HTTP is served.
            from tidewire.server.http.gateway import HttpGateway  # noqa: PLC0415

            gateway = HttpGateway.for_broker(broker, settings.http)
            try:
                await gateway.start()
            except BaseException as exc:
                await server.close()
                if isinstance(exc, OSError):
                    raise InvalidConfigError(str(exc.strerror or exc)) from None
                raise
        # One line for people and scripts alike: where to connect.
        typer.echo(f"tidewire {__version__} listening on {settings.server.host}:{server.port}")
        log.info("event loop: %s", loop_name)
        if gateway is not None:
            for name in gateway.names:
                host, port = gateway.host_of(name), gateway.port_of(name)
                typer.echo(f"tidewire {__version__} HTTP {name} listening on http://{host}:{port}")
        await stop.wait()
        log.info("draining: no new connections, finishing in-flight requests")
        if gateway is not None:
            await gateway.close()
        await server.close()
    log.info("stopped cleanly")


@config_app.command("init")
def config_init(
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Write to this file (refused if it exists) instead of stdout.",
            dir_okay=False,
        ),
    ] = None,
) -> None:
    """Print a configuration file of every setting at its default, with a comment each."""
    text = default_toml()
    if output is None:
        typer.echo(text, nl=False)
        return
    try:
        with open(output, "x", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        fail(f"cannot write {output}: {exc.strerror}")
    typer.echo(f"wrote {output}", err=True)


@config_app.command("show")
def config_show(
    config: ConfigOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print JSON instead of TOML.", show_default=False)
    ] = False,
) -> None:
    """Print the settings serve would run with (file < environment), and where each came
    from."""
    try:
        settings = load_settings(config)
    except InvalidConfigError as exc:
        fail(exc.message, EXIT_USAGE)
    if as_json:
        doc: dict[str, dict[str, object]] = {s: {} for s in SECTIONS}
        for s in SETTINGS:
            value = settings.value(s.key)
            doc[s.section][s.key] = str(value) if isinstance(value, FsyncPolicy) else value
        echo_json({"settings": doc, "origins": dict(settings.origins)})
        return
    for section in SECTIONS:
        typer.echo(f"[{section}]")
        for s in SETTINGS:
            if s.section == section:
                value = toml_value(settings.value(s.key))
                typer.echo(f"{s.key} = {value}  # {settings.origins[s.key]}")
        typer.echo("")
