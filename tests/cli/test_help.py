"""``--help`` of every command is clean: no type placeholder on flags (``<bool>``), no blank
default, and ``serve --help`` shows each setting's default and environment variable as the
config classes define them."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer import _click
from typer.core import TyperGroup

from tests.cli._support import run_cli
from tidewire.cli import app
from tidewire.config import SETTINGS


def commands() -> Iterator[list[str]]:
    """The argv of every command and group, the root first."""

    root = typer.main.get_command(app)
    ctx = _click.Context(root)

    def walk(cmd: Any, path: list[str]) -> Iterator[list[str]]:
        yield path
        if isinstance(cmd, TyperGroup):  # a group: its commands, lazy ones too
            for name in sorted(cmd.list_commands(ctx)):
                yield from walk(cmd.get_command(ctx, name), [*path, name])

    yield from walk(root, [])


COMMANDS = list(commands())


def options_help(*argv: str) -> dict[str, str]:
    """A command's options in its --help: the first name -> the option's entry, its wrapped
    lines joined by single spaces."""
    out = run_cli([*argv, "--help"], env={"COLUMNS": "200"}).stdout
    entries: list[str] = []
    for line in out.split("Options:", 1)[1].splitlines():
        if line.startswith("  -"):
            entries.append(line)
        elif line.startswith("   ") and entries:
            entries[-1] += " " + line
    return {e.split()[0]: " ".join(e.split()) for e in entries}


def test_every_command_is_walked() -> None:
    names = {" ".join(c) for c in COMMANDS}
    assert {"", "serve", "consume", "topic create", "group reset", "bench e2e"} <= names
    assert len(COMMANDS) > 20


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda c: " ".join(c) or "tidewire")
def test_help_is_clean(argv: list[str]) -> None:
    result = run_cli([*argv, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "Show this message and exit." in out
    assert "<bool>" not in out
    assert not re.search(r"\[default:\s*\]", out), out
    assert "[default: (" not in out


def test_serve_help_shows_every_default_and_env_var() -> None:
    lines = options_help("serve")
    for s in SETTINGS:
        line = lines[s.flag]
        default = s.default
        if isinstance(default, bool):
            shown = s.flag if default else "--no-" + s.flag[2:]
        elif isinstance(default, int) and abs(default) >= 10_000:
            shown = f"{default:,}"
        else:
            shown = str(default)
        assert line.endswith(f"[default: {shown}; env: {s.env}]"), line
    assert lines["--port"].endswith("[default: 7400; env: TIDEWIRE_PORT]")
    assert lines["--max-message-bytes"].endswith(
        "[default: 16,777,216; env: TIDEWIRE_MAX_MESSAGE_BYTES]"
    )
    assert "--max-batch-bytes" not in lines  # the deprecated name works, hidden


def test_consume_key_separator_default_is_named() -> None:
    assert options_help("consume")["--key-separator"].endswith("[default: a tab]")


def test_a_client_command_does_not_load_the_broker() -> None:
    """The commands of the broker, the load generator, Spark and certificates load their
    modules when they run: the others start without them (about half the time)."""
    code = (
        "import sys\n"
        "from tidewire.cli import app\n"
        "heavy = ('tidewire.broker.core', 'tidewire.storage.log', 'tidewire.server.tcp',\n"
        "         'tidewire.config', 'tidewire.cluster', 'cryptography.x509')\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.parametrize("argv", [["bench", "produce"], ["cluster", "status"]])
def test_a_command_loaded_when_it_runs_takes_the_tls_and_credential_options(
    argv: list[str],
) -> None:
    options = options_help(*argv)
    assert {"--addr", "--tls", "--tls-ca", "--api-key", "--sasl-mechanism"} <= set(options)


def test_the_root_addr_reaches_a_command_loaded_when_it_runs() -> None:
    result = run_cli(["--addr", "127.0.0.1:9", "cluster", "status"])
    assert result.exit_code == 1
    assert "127.0.0.1:9" in result.stderr


@pytest.mark.parametrize(("typo", "meant"), [("serv", "serve"), ("clustr", "cluster")])
def test_a_typo_of_a_command_loaded_when_it_runs_is_suggested(typo: str, meant: str) -> None:
    result = run_cli([typo])
    assert result.exit_code == 2
    assert f"No such command '{typo}'. Did you mean '{meant}'" in result.stderr
