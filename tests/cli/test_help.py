"""``--help`` of every command is clean: no type placeholder on flags (``<bool>``), no blank
default, and ``serve --help`` shows each setting's default and environment variable as the
config classes define them."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer

from tests.cli._support import run_cli
from tidewire.cli import app
from tidewire.config import SETTINGS


def commands() -> Iterator[list[str]]:
    """The argv of every command and group, the root first."""

    def walk(cmd: Any, path: list[str]) -> Iterator[list[str]]:
        yield path
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):  # a group's commands
            yield from walk(sub, [*path, name])

    yield from walk(typer.main.get_command(app), [])


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
