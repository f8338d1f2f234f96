"""Shared by the msgbus and iPubSub migration tests: a section of docs/migrating.md, its
commands, a ``tidewire serve`` with compatibility listeners on free ports, and documented shell
commands run as a user would (with ``curl`` when installed, else the same request by httpx).
"""

from __future__ import annotations

import contextlib
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.cli._support import STARTUP_S, popen_serve, stop, subprocess_env

MIGRATING = Path(__file__).resolve().parents[2] / "docs" / "migrating.md"


def section(title: str) -> str:
    """The text of the section ``## title`` of docs/migrating.md, up to the next ``## ``."""
    text = MIGRATING.read_text(encoding="utf-8")
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def documented_commands(text: str) -> set[str]:
    """Every command the section shows: ``$ ...`` lines of its console blocks and
    ```$ ...``` in its tables (the tidewire column)."""
    lines = {m.group(1) for m in re.finditer(r"(?m)^\$ (.+)$", text)}
    cells = {m.group(1) for m in re.finditer(r"`\$ (tidewire [^`]+|pip [^`]+)`", text)}
    return lines | cells


def code_block(text: str, lang: str) -> str:
    """The first fenced block of ``lang`` in ``text``."""
    m = re.search(rf"```{lang}\n(.*?)```", text, re.S)
    assert m, f"no {lang} block"
    return m.group(1)


@dataclass(frozen=True, slots=True)
class Served:
    """A ``tidewire serve`` process and its HTTP listeners' URLs by name."""

    proc: subprocess.Popen[str]
    urls: dict[str, str]

    def port(self, name: str) -> int:
        return int(self.urls[name].rsplit(":", 1)[1])


@contextlib.contextmanager
def serve(*args: str, listeners: int = 1) -> Iterator[Served]:
    """``tidewire serve --port 0 ARGS``; waits for the TCP line and ``listeners`` HTTP lines;
    always stopped."""
    proc = popen_serve("--port", "0", *args)
    try:
        assert proc.stdout is not None
        assert "listening on 127.0.0.1:" in proc.stdout.readline()
        urls = {}
        for _ in range(listeners):
            line = proc.stdout.readline()
            m = re.search(r"HTTP (\w+) listening on (http://127\.0\.0\.1:\d+)", line)
            assert m, line
            urls[m.group(1)] = m.group(2)
        yield Served(proc, urls)
    finally:
        stop(proc)


def shell(command: str, cwd: Path | None = None) -> str:
    """Run a documented shell command (a pipeline of curl, jq, base64, echo); its stdout.
    Without curl on this machine, a ``curl`` stage is sent by httpx instead."""
    if shutil.which("curl") is None and command.startswith("curl "):
        first, _, rest = command.partition(" | ")
        out = _curl_by_httpx(first)
        if not rest:
            return out
        command = rest
        return subprocess.run(
            ["bash", "-c", command],
            input=out,
            capture_output=True,
            text=True,
            check=True,
            timeout=STARTUP_S,
            cwd=cwd,
            env=subprocess_env(),
        ).stdout
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        capture_output=True,
        text=True,
        check=True,
        timeout=STARTUP_S,
        cwd=cwd,
        env=subprocess_env(),
    )
    return done.stdout


def _curl_by_httpx(command: str) -> str:
    """The request of a ``curl`` command line (-X, -d, -H, -q, -o -, --json), by httpx."""
    args = shlex.split(command)[1:]
    method, data, headers, url = "", None, {}, ""
    i = 0
    while i < len(args):
        a = args[i]
        if a == "-X":
            method, i = args[i + 1], i + 2
        elif a in ("-d", "--json"):
            data, i = args[i + 1].encode(), i + 2
            if a == "--json":
                headers["Content-Type"] = "application/json"
        elif a == "-H":
            k, _, v = args[i + 1].partition(":")
            headers[k.strip()] = v.strip()
            i += 2
        elif a == "-o":
            i += 2
        elif a.startswith("-"):
            i += 1
        else:
            url, i = a, i + 1
    method = method or ("POST" if data is not None else "GET")
    if data is not None:  # curl -d sends a form unless told otherwise
        headers.setdefault("Content-Type", "application/x-www-form-urlencoded")
    r = httpx.request(method, url, content=data, headers=headers, timeout=STARTUP_S + 30)
    return r.text
