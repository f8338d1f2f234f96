"""What the migration tests share: the sections of docs/migrating.md (so that each test runs
the page's own translations, not a copy of them), and a real ``tidewire serve`` with its
HTTP API on free ports."""

from __future__ import annotations

import contextlib
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli._support import STARTUP_S, popen_serve, stop

DOC = Path(__file__).resolve().parents[2] / "docs" / "migrating.md"

_LISTENING = re.compile(r"listening on 127\.0\.0\.1:(\d+)")
_HTTP = re.compile(r"HTTP native listening on http://127\.0\.0\.1:(\d+)")


def section(heading: str) -> str:
    """The text under ``heading`` (a ``## `` or ``### `` line) up to the next heading of the
    same or a higher level (``#`` lines inside code blocks are not headings)."""
    level = len(heading.split(" ", 1)[0])
    lines = DOC.read_text(encoding="utf-8").splitlines(keepends=True)
    start = lines.index(heading + "\n") + 1
    fenced = False
    for i in range(start, len(lines)):
        line = lines[i]
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"(#+) ", line)) and len(m.group(1)) <= level:
            return "".join(lines[start:i])
    return "".join(lines[start:])


def code_blocks(text: str, lang: str) -> list[str]:
    """The bodies of the fenced ``lang`` blocks of ``text``, in order."""
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def table_column(text: str, column: int) -> list[str]:
    """Column ``column`` of the (first) table in ``text``, header and rule left out, with
    each cell's code spans unwrapped (``\\|`` is a literal bar)."""
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    cells = [re.split(r"(?<!\\) \| ", row.strip("| "))[column] for row in rows[1:]]
    return [cell.replace("\\|", "|") for cell in cells]


def code_span(cell: str) -> str:
    """The first code span of a table cell."""
    m = re.search(r"`([^`]+)`", cell)
    assert m is not None, f"no code in {cell!r}"
    return m.group(1)


def shell_commands(block: str) -> list[str]:
    """The commands of a shell block: comment lines left out, continued lines joined."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line for line in joined.splitlines() if line.strip() and not line.startswith("#")]


def tidewire_argv(command: str) -> list[str]:
    """A ``tidewire ...`` command line as the argv that runs it with this interpreter."""
    words = shlex.split(command)
    assert words[0] == "tidewire", command
    return [sys.executable, "-m", "tidewire", *words[1:]]


def shell_with_tidewire(command: str) -> str:
    """A shell command line whose ``tidewire`` commands (the word in command position: at
    the start, or after ``|``, ``&&``, ``;``) run with this interpreter."""
    run = f"{shlex.quote(sys.executable)} -m tidewire"
    return re.sub(r"(^|\|\s*|&&\s*|;\s*)tidewire(?=\s|$)", lambda m: m.group(1) + run, command)


@dataclass(frozen=True, slots=True)
class Served:
    """A ``tidewire serve`` process with its binary and HTTP ports."""

    proc: subprocess.Popen[str]
    port: int
    http_port: int

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"


@contextlib.contextmanager
def serving(*args: str, env: Mapping[str, str] | None = None) -> Iterator[Served]:
    """``tidewire serve ARGS`` (which must serve HTTP): started, its two ports read from its
    first lines, stopped at the end."""
    proc = popen_serve(*args, env=env)
    assert proc.stdout is not None
    try:
        port = http_port = None
        lines = []
        while port is None or http_port is None:
            line = proc.stdout.readline()
            lines.append(line)
            if not line:
                pytest.fail(f"serve did not start: {lines!r}")
            if (m := _HTTP.search(line)) is not None:
                http_port = int(m.group(1))
            elif (m := _LISTENING.search(line)) is not None:
                port = int(m.group(1))
        yield Served(proc, port, http_port)
    finally:
        stop(proc)


def terminate(served: Served) -> None:
    """Stop a broker with SIGTERM (a clean drain) and wait for it."""
    served.proc.terminate()
    served.proc.wait(timeout=STARTUP_S)
