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

Other blocks (```console transcripts, ```text, ```toml, ...) are not programs.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
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
