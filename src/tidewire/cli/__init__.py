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

import importlib
from difflib import get_close_matches
from typing import Annotated, Any

import typer
from typer import _click  # typer's own click, which its groups and commands are made of
from typer.core import TyperGroup

from tidewire import __version__

from ._acl import acl_app
from ._audit import audit
from ._common import add_credential_options, add_tls_options
from ._compat_000 import addr_defaults, consumer_app, tail
from ._consume import consume
from ._dlq import dlq_app
from ._group import group_app
from ._health import health
from ._log_level import log_level
from ._metrics import metrics
from ._msgbus_cli import register as register_msgbus_commands
from ._publish import publish
from ._queues import bind, exchange_app, queue_app, unbind
from ._quota import quota_app
from ._stream import stream_app
from ._topic import topic_app
from ._user import key_app, user_app

__all__ = ["app", "main"]

#: Commands whose modules load the broker, the load generator, Spark or cryptography (a
#: second or more on the reference machine): imported when one of them runs or a help lists
#: them, so that a client command starts in about half the time. Name -> (module, the
#: function or sub-app in it, the command listed before it in --help: None for the first).
_LAZY = {
    "serve": ("._serve", "serve", None),
    "export": ("._export", "export", "tail"),
    "config": ("._serve", "config_app", "pull"),
    "bench": ("._bench", "bench_app", "consumer"),
    "certs": ("._certs", "certs_app", "bench"),
    "cluster": ("._cluster", "cluster_app", "certs"),
}


class _LazyGroup(TyperGroup):
    """The root command group: :data:`_LAZY`'s commands are built when first asked for."""

    def list_commands(self, ctx: _click.Context) -> list[str]:
        names = [n for n in super().list_commands(ctx) if n not in _LAZY]
        for name, (_, _, after) in _LAZY.items():
            assert after is None or after in names, f"{name} is listed after {after}: gone"
            names.insert(0 if after is None else names.index(after) + 1, name)
        return names

    def get_command(self, ctx: _click.Context, cmd_name: str) -> _click.Command | None:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is None and cmd_name in _LAZY:
            cmd = self.commands[cmd_name] = _load(cmd_name)
        return cmd

    def resolve_command(
        self, ctx: _click.Context, args: list[str]
    ) -> tuple[str | None, _click.Command | None, list[str]]:
        """As typer's, with the commands not built yet among the suggestions for a typo
        (typer suggests from the commands built)."""
        try:
            return super().resolve_command(ctx, args)
        except _click.exceptions.UsageError as exc:
            if self.suggest_commands and args and exc.message.startswith("No such command"):
                base = exc.message.split(". Did you mean", 1)[0].rstrip(".")
                matches = get_close_matches(args[0], self.list_commands(ctx))
                said = ", ".join(repr(m) for m in matches)
                exc.message = f"{base}. Did you mean {said}?" if matches else f"{base}."
            raise


#: The commands of :data:`_LAZY` built so far (once each: building one adds options to its
#: functions, and each run of the app builds its root group again).
_built: dict[str, _click.Command] = {}


def _load(name: str) -> _click.Command:
    """The click command of :data:`_LAZY`'s ``name``, built as registering it on the root
    app would have: with the TLS and credential options of a command that takes --addr."""
    if name in _built:
        return _built[name]
    module, attr, _ = _LAZY[name]
    obj: Any = getattr(importlib.import_module(module, __name__), attr)
    one = typer.Typer(add_completion=False, rich_markup_mode=None)
    if isinstance(obj, typer.Typer):
        one.add_typer(obj)
    else:
        one.command(name=name)(obj)
    # A callback makes the app a group, whatever it holds: its one command is the one built.
    one.callback()(lambda: None)
    add_tls_options(one)
    add_credential_options(one)
    group = typer.main.get_command(one)
    assert isinstance(group, TyperGroup)
    cmd = _built[name] = group.commands[name]
    return cmd


app = typer.Typer(
    cls=_LazyGroup,
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
register_msgbus_commands(app)  # pub, sub, pull: msgbus' client (docs/migrating.md)
# Last: every command registered above that takes --addr gets --tls, --tls-ca, ...
add_tls_options(app)
# ... and --api-key, --sasl-mechanism (the administration commands declare them themselves).
add_credential_options(app)


def main() -> None:
    """Entry point of the ``tidewire`` command."""
    app()
