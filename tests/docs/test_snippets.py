"""Every code block of README.md and docs/*.md runs, as written.

- A ```python block is a program: it runs in a fresh interpreter, in an empty directory.
- A ```sh block runs in ``bash -euo pipefail`` with ``tidewire`` on ``PATH``.
- Either may need a broker: the examples connect to ``127.0.0.1:7400``, where
  ``scripts/serve`` runs one (README, "Quickstart"); here a broker runs on a free port for
  each block, and that address replaces ``127.0.0.1:7400`` in the block and is
  ``TIDEWIRE_ADDR`` (the client commands' documented variable). Nothing else is changed.
- A block that is deliberately a fragment (it uses names it does not define, runs until
  Ctrl-C, or needs a cluster) is marked by an HTML comment on the line before its fence,
  ``<!-- fragment: why -->``: it is compiled (Python, with top-level ``await`` allowed, as in
  ``python -m asyncio``) or checked by ``bash -n``, not run.
- A Python program that uses Spark runs only in the ``spark`` tests (it starts a JVM).

- A ```console block is a transcript: its ``$ `` lines (with ``\\`` continuation lines) are
  commands, the lines after each its output. The transcripts of one document continue each
  other (docs/http.md creates a topic, then publishes to it), so they run in document order,
  each command in ``bash -o pipefail`` in one work directory, against one broker per document
  started with ``--partitions 3`` and, where the document uses them, its HTTP listeners on
  free ports (``localhost:8080``/``127.0.0.1:8080``: the native API, ``localhost:8000``: the
  msgbus one); those addresses and ``127.0.0.1:7400``/``localhost:7400`` are replaced by the
  real ones. Each command exits 0, unless its shown output says it fails (starts with
  ``error:`` or ``unhealthy:``, or has ``"healthy":false``): then it exits non-zero. Where
  output is shown, the real output (stdout, or stderr when stdout is empty) matches it
  loosely, as values (offsets, timings) differ: JSON has the same top-level keys; a
  ``-w '%{http_code}'`` status line is the same status; text starts with the same word and
  has the same number of lines (at least as many as shown before a ``...`` or ``(...)``
  line that elides the rest). A transcript marked as a fragment is checked by ``bash -n``.

Other blocks (```text, ```toml, ...) are not programs.
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli._support import serving, subprocess_env

ROOT = Path(__file__).resolve().parents[2]
#: docs/migrating.md is left to tests/migrating/, which runs each of its blocks against brokers
#: on the ports its examples name (they start servers in the foreground, as the systems they
#: replace are started).
DOCS = [
    ROOT / "README.md",
    *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "migrating.md"),
]
#: The address the examples use: the broker scripts/serve runs.
EXAMPLE_ADDR = "127.0.0.1:7400"
#: How long one block may run (s); generous for a loaded 2-core machine.
RUN_TIMEOUT_S = 300

_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*(fragment)\b(.*?)-->\s*$")


@dataclass(frozen=True, slots=True)
class Block:
    path: Path
    line: int  # of the opening fence, from 1
    lang: str
    code: str
    fragment: bool

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def spark(self) -> bool:
        return bool(re.search(r"\bspark\b|pyspark", self.code))


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of one Markdown file."""
    found: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2)
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        prev = next((ln for ln in reversed(lines[:start]) if ln.strip()), "")
        code = textwrap.dedent("\n".join(body)) if indent else "\n".join(body)
        found.append(Block(path, start + 1, lang, code + "\n", bool(_MARKER.match(prev))))
    return found


ALL = [b for p in DOCS for b in blocks(p)]
PYTHON = [b for b in ALL if b.lang in ("python", "py")]
SHELL = [b for b in ALL if b.lang in ("sh", "bash", "shell")]


def _ids(b: Block) -> str:
    return b.id


def test_blocks_are_found() -> None:
    readme = [b for b in ALL if b.path.name == "README.md"]
    assert len([b for b in readme if b.lang == "python"]) >= 4
    assert len([b for b in readme if b.lang == "sh"]) >= 3
    assert len(PYTHON) >= 15
    # Every fragment marker stands right before a block (none left dangling by an edit).
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").splitlines()
        for n, line in enumerate(lines):
            if _MARKER.match(line):
                nxt = next((ln for ln in lines[n + 1 :] if ln.strip()), "")
                assert _FENCE.match(nxt), f"{path.name}:{n + 1}: a marker before no block"


def _compile(block: Block) -> None:
    compile(block.code, block.id, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def _env(addr: str | None, bin_dir: Path) -> dict[str, str]:
    extra = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    if addr is not None:
        extra["TIDEWIRE_ADDR"] = addr
    return subprocess_env(extra)


def _tidewire_on_path(tmp_path: Path) -> Path:
    """A ``tidewire`` command (this interpreter, these sources) in a directory of its own."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "tidewire"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m tidewire "$@"\n')
    script.chmod(0o755)
    return bin_dir


def _run(argv: list[str], block: Block, tmp_path: Path, addr: str | None) -> None:
    work = tmp_path / "work"
    work.mkdir()
    env = _env(addr, _tidewire_on_path(tmp_path))
    env["PYSPARK_PYTHON"] = sys.executable  # Spark's workers: this interpreter (docs/spark.md)
    result = subprocess.run(
        argv,
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, (
        f"{block.id} failed with exit code {result.returncode}\n"
        f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}"
    )


def _run_block(block: Block, tmp_path: Path) -> None:
    needs_broker = block.lang != "python" or EXAMPLE_ADDR in block.code
    if block.lang == "python":
        argv_of = lambda code: [sys.executable, "-c", code]  # noqa: E731
    else:
        argv_of = lambda code: ["bash", "-euo", "pipefail", "-c", code]  # noqa: E731
    if not needs_broker:
        _run(argv_of(block.code), block, tmp_path, None)
        return
    with serving(tmp_path / "broker-data", "--partitions", "3") as (_, port):
        addr = f"127.0.0.1:{port}"
        _run(argv_of(block.code.replace(EXAMPLE_ADDR, addr)), block, tmp_path, addr)


@pytest.mark.parametrize("block", [b for b in PYTHON if not b.spark], ids=_ids)
def test_python(block: Block, tmp_path: Path) -> None:
    _compile(block)
    if not block.fragment:
        _run_block(block, tmp_path)


@pytest.mark.parametrize("block", [b for b in PYTHON if b.spark], ids=_ids)
def test_python_with_spark_compiles(block: Block) -> None:
    _compile(block)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("block", [b for b in PYTHON if b.spark and not b.fragment], ids=_ids)
def test_python_with_spark_runs(block: Block, tmp_path: Path) -> None:
    _run_block(block, tmp_path)


@pytest.mark.parametrize("block", SHELL, ids=_ids)
def test_shell(block: Block, tmp_path: Path) -> None:
    check = subprocess.run(
        ["bash", "-n", "-c", block.code], capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, f"{block.id}: {check.stderr}"
    if not block.fragment:
        _run_block(block, tmp_path)


# ```console transcripts ------------------------------------------------------------------

#: The HTTP listeners' example addresses, by listener name (``serve --http-*-port``).
HTTP_EXAMPLES = {"native": ("8080", "--http-port"), "msgbus": ("8000", "--http-msgbus-port")}
CONSOLE = [b for b in ALL if b.lang == "console"]
#: How long one transcript command may run (s).
COMMAND_TIMEOUT_S = 120


@dataclass(frozen=True, slots=True)
class Command:
    line: str  # as written, continuation lines joined
    output: list[str]  # the transcript's lines after it


def commands(block: Block) -> list[Command]:
    """A transcript's ``$ `` commands (with their ``\\`` continuation lines) and their shown
    output."""
    found: list[Command] = []
    lines = block.code.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            i += 1
            continue
        cmd = lines[i][2:]
        while cmd.endswith("\\") and i + 1 < len(lines):
            i += 1
            cmd = cmd + "\n" + lines[i]
        i += 1
        out: list[str] = []
        while i < len(lines) and not lines[i].startswith("$ "):
            out.append(lines[i])
            i += 1
        while out and not out[-1].strip():
            out.pop()
        found.append(Command(cmd, out))
    return found


def _top_keys(text: str) -> set[str]:
    """The keys at the top level of the JSON object(s) in ``text``, which may elide parts with
    ``...`` (so it is scanned, not parsed)."""
    keys: set[str] = set()
    depth = 0
    i = 0
    while i < len(text):
        c = text[i]
        if c == '"':
            j = i + 1
            while j < len(text) and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            if depth == 1 and text[j + 1 : j + 2] == ":":
                keys.add(text[i + 1 : j])
            i = j + 1
            continue
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
        i += 1
    return keys


def _fails(shown: list[str]) -> bool:
    """Whether the transcript shows the command failing."""
    first = shown[0] if shown else ""
    return first.startswith(("error:", "unhealthy:")) or '"healthy":false' in first


def _check_output(cmd: Command, real: str, where: str) -> None:
    shown = cmd.output
    if not shown:
        return
    got = real.splitlines()
    assert got, f"{where}: printed nothing, the transcript shows {shown[0]!r}"
    if shown[0].startswith(("{", "[")):
        assert _top_keys("\n".join(shown)) == _top_keys(real), (
            f"{where}: JSON keys differ\n--- shown\n{chr(10).join(shown)}\n--- real\n{real}"
        )
        return
    if re.fullmatch(r"\d{3}", shown[-1]) and "http_code" in cmd.line:
        assert got[-1] == shown[-1], f"{where}: HTTP status {got[-1]}, shown {shown[-1]}"
        return
    assert got[0].split()[:1] == shown[0].split()[:1], (
        f"{where}: output starts {got[0]!r}, the transcript shows {shown[0]!r}"
    )
    elided = next(
        (n for n, ln in enumerate(shown) if ln.strip() == "..." or ln.startswith("(")), None
    )
    if elided is None:
        assert len(got) == len(shown), (
            f"{where}: {len(got)} line(s) of output, the transcript shows {len(shown)}\n"
            f"--- shown\n{chr(10).join(shown)}\n--- real\n{real}"
        )
    else:
        assert len(got) >= elided, f"{where}: {len(got)} line(s), shown {elided} and more"


def _http_ports(proc: subprocess.Popen[str], names: list[str]) -> dict[str, int]:
    """The HTTP listeners' ports, read from serve's lines after the first."""
    assert proc.stdout is not None
    ports: dict[str, int] = {}
    while len(ports) < len(names):
        line = proc.stdout.readline()
        m = re.search(r"HTTP (\w+) listening on http://127\.0\.0\.1:(\d+)", line)
        assert m is not None, f"serve printed {line!r}"
        ports[m.group(1)] = int(m.group(2))
    return ports


@dataclass(frozen=True, slots=True)
class Session:
    """Where one document's transcripts run: its broker, its work directory, its shell's
    environment and the example addresses to replace."""

    work: Path
    env: dict[str, str]
    subst: dict[str, str]


def _start_session(path: Path, tmp: Path, stack: contextlib.ExitStack) -> Session:
    code = "".join(b.code for b in CONSOLE if b.path == path and not b.fragment)
    http = [name for name, (port, _) in HTTP_EXAMPLES.items() if f":{port}" in code]
    flags = [a for name in http for a in (HTTP_EXAMPLES[name][1], "0")]
    proc, port = stack.enter_context(serving(tmp / "broker-data", "--partitions", "3", *flags))
    addr = f"127.0.0.1:{port}"
    subst = {EXAMPLE_ADDR: addr, "localhost:7400": addr}
    for name, real in _http_ports(proc, http).items():
        example = HTTP_EXAMPLES[name][0]
        subst[f"localhost:{example}"] = subst[f"127.0.0.1:{example}"] = f"127.0.0.1:{real}"
    work = tmp / "work"
    work.mkdir()
    return Session(work, _env(addr, _tidewire_on_path(tmp)), subst)


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[Path, Session]]:
    """One :class:`Session` per document, started by its first transcript that runs."""
    with contextlib.ExitStack() as stack:
        yield _Sessions(tmp_path_factory, stack)


class _Sessions(dict[Path, Session]):
    def __init__(self, factory: pytest.TempPathFactory, stack: contextlib.ExitStack) -> None:
        super().__init__()
        self.factory, self.stack = factory, stack

    def __missing__(self, path: Path) -> Session:
        self[path] = _start_session(path, self.factory.mktemp(path.stem), self.stack)
        return self[path]


def _run_console(block: Block, session: Session) -> None:
    for n, cmd in enumerate(commands(block), 1):
        line = cmd.line
        for example, real in session.subst.items():
            line = line.replace(example, real)
        where = f"{block.id} command {n} ({cmd.line.splitlines()[0]!r})"
        result = subprocess.run(
            ["bash", "-o", "pipefail", "-c", line],
            cwd=session.work,
            env=session.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
        fails = _fails(cmd.output)
        assert (result.returncode != 0) == fails, (
            f"{where}: exit code {result.returncode}\n"
            f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}"
        )
        _check_output(cmd, result.stdout or result.stderr, where)


@pytest.mark.parametrize("block", CONSOLE, ids=_ids)
def test_console(block: Block, sessions: dict[Path, Session]) -> None:
    cmds = commands(block)
    assert cmds, f"{block.id}: a transcript with no '$ ' command"
    script = "\n".join(c.line for c in cmds) + "\n"
    check = subprocess.run(
        ["bash", "-n", "-c", script], capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, f"{block.id}: {check.stderr}"
    if not block.fragment:
        _run_console(block, sessions[block.path])


def test_transcripts_are_read() -> None:
    assert len(CONSOLE) >= 30
    assert len([b for b in CONSOLE if not b.fragment]) >= 15
    block = Block(ROOT, 1, "console", "$ echo a \\\n  b\na b\n$ true\n$ x\n{}\n", False)
    assert commands(block) == [
        Command("echo a \\\n  b", ["a b"]),
        Command("true", []),
        Command("x", ["{}"]),
    ]
    assert _top_keys('{"a":{"b":1},"c":[{"d":2}],...}\n{"e":"x\\"y"}') == {"a", "c", "e"}
    assert _fails(["error: no"])
    assert not _fails(["ok"])
    assert not _fails([])
