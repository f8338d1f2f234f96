"""The ``tidewire`` command.

- ``tidewire serve``: run a broker (settings from ``--config FILE``, ``TIDEWIRE_*``
  environment variables and flags; :mod:`tidewire.config`) until SIGTERM or SIGINT, then
  drain: stop accepting, let in-flight requests finish, flush every log, write the
  clean-shutdown marker.
- ``tidewire config init | show``: the default configuration file; the settings in effect.
- ``tidewire topic create | list | describe | alter | delete``: administration.
- ``tidewire publish``, ``tidewire consume``: messages in and out (``consume --group G``
  as a member of a consumer group).
- ``tidewire group list | describe | reset | delete``: consumer groups, offsets and lag.
- ``tidewire exchange declare | delete | list``, ``tidewire queue declare | delete | purge |
  list | describe``, ``tidewire bind | unbind``: queues and exchanges (docs/queues.md);
  ``publish --exchange X --routing-key K`` publishes into them, ``consume --queue Q`` takes
  and acknowledges their messages, ``tidewire dlq list | replay | purge``: dead letters.
- ``tidewire stream send | receive | read | list | describe``: lightweight streams
  (docs/streams.md): send, take (work queue), read by resume token (fan-out).
- ``tidewire health``: ping a broker; exit code 0 when it answers.
- ``tidewire metrics``: a summary of the broker's ``/metrics`` (over its HTTP API).
- ``tidewire user | key | acl | quota``: principals and their roles, API keys (shown once),
  ACL entries and quotas (docs/security.md).
- ``tidewire audit``: the audit log (who did what, from where, allowed or denied).
- ``tidewire bench produce | consume``: the load generator (throughput and latency).
- ``tidewire export TOPIC --to DIR``: copy a topic into partitioned Parquet with Spark,
  exactly once, continuously or ``--once``.
- ``tidewire --version``.
- pubsub-broker's ``brokectl`` spellings: ``tidewire --addr A COMMAND``, ``consumer list``,
  ``tail --topic T --count N``, ``topic create --name``, ``publish --topic --payload``
  (docs/migrating.md).

- ``tidewire certs init DIR``: a development CA, server and client certificates for TLS.
- ``tidewire cluster status | nodes``: a cluster's nodes, controller and partition leaders,
  as any of its nodes answers (docs/cluster.md); ``serve --cluster etcd://...`` runs a node.

The client commands take ``--addr HOST:PORT`` (or ``TIDEWIRE_ADDR``), ``--api-key`` (or
``TIDEWIRE_API_KEY``) and ``--sasl-mechanism``, and ``--tls``, ``--tls-ca``, ``--tls-cert``,
``--tls-key``, ``--tls-server-name`` (``TIDEWIRE_TLS_*``). An error prints one line on
stderr; exit codes: 0 success, 1 an error from the broker or the connection, 2 a usage or
configuration error, 130 interrupted. The reference is docs/cli.md.
"""

from __future__ import annotations

from typing import Annotated

import typer

from tidewire import __version__

from ._acl import acl_app
from ._audit import audit
from ._bench import bench_app
from ._certs import certs_app
from ._cluster import cluster_app
from ._common import add_credential_options, add_tls_options
from ._compat_000 import addr_defaults, consumer_app, tail
from ._consume import consume
from ._dlq import dlq_app
from ._export import export
from ._group import group_app
from ._health import health
from ._log_level import log_level
from ._metrics import metrics
from ._msgbus_cli import register as register_msgbus_commands
from ._publish import publish
from ._queues import bind, exchange_app, queue_app, unbind
from ._quota import quota_app
from ._serve import config_app, serve
from ._stream import stream_app
from ._topic import topic_app
from ._user import key_app, user_app

__all__ = ["app", "main"]

app = typer.Typer(
    name="tidewire",
    help="tidewire: a pub/sub message broker with partitioned, durable topics.",
    no_args_is_help=True,
    add_completion=False,
    # Plain help, for every command (sub-apps inherit it): typer's rich help prints a type
    # placeholder for every flag (`--help <bool>`) and reads "[default: ...]" in help texts
    # as markup.
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        from tidewire.records import IMPLEMENTATION  # noqa: PLC0415 (only for --version)

        typer.echo(f"tidewire {__version__} (record codec: {IMPLEMENTATION})")
        raise typer.Exit


@app.callback()
def _root(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_version,
            is_eager=True,
            help="Print the version, and which record codec runs (compiled or python), and exit.",
        ),
    ] = False,
    addr: Annotated[
        str | None,
        typer.Option(
            "--addr",
            help="The broker, HOST:PORT, for the command that follows (as brokectl takes "
            "it); the command's own --addr and TIDEWIRE_ADDR win.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """tidewire: a pub/sub message broker with partitioned, durable topics."""
    if addr is not None:
        ctx.default_map = addr_defaults(ctx.command, addr)


app.command()(serve)
app.add_typer(config_app)
app.add_typer(topic_app)
app.add_typer(group_app)
app.command()(publish)
app.command()(consume)
app.add_typer(exchange_app)
app.add_typer(queue_app)
app.command()(bind)
app.command()(unbind)
app.add_typer(dlq_app)
app.add_typer(stream_app)
app.command()(health)
app.command()(metrics)
app.add_typer(user_app)
app.add_typer(key_app)
app.add_typer(acl_app)
app.add_typer(quota_app)
app.command()(audit)
app.command(name="log-level")(log_level)
app.add_typer(consumer_app)
app.command()(tail)
app.add_typer(bench_app)
app.command()(export)
register_msgbus_commands(app)  # pub, sub, pull: msgbus' client (docs/migrating.md)
app.add_typer(certs_app)
app.add_typer(cluster_app)
# Last: every command registered above that takes --addr gets --tls, --tls-ca, ...
add_tls_options(app)
# ... and --api-key, --sasl-mechanism (the administration commands declare them themselves).
add_credential_options(app)


def main() -> None:
    """Entry point of the ``tidewire`` command."""
    app()
