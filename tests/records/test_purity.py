"""``tidewire.records`` does no I/O: no sockets, files, clocks, threads or event loops (STYLE.md,
rule 1). Checked on the source, so a lazy import inside a function is caught too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tidewire.records

RECORDS_DIR = Path(tidewire.records.__file__).parent

FORBIDDEN_MODULES = frozenset(
    {
        "socket",
        "asyncio",
        "os",
        "time",
        "threading",
        "selectors",
        "subprocess",
        "pathlib",
        "shutil",
        "tempfile",
        "datetime",
        "random",
    }
)
FORBIDDEN_CALLS = frozenset({"open", "__import__"})


def violations(source: str, filename: str = "<source>") -> list[str]:
    """Every forbidden import or call in ``source``, as ``file:line: what``."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename)):
        line = getattr(node, "lineno", 0)
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        for module in modules:
            if module.split(".")[0] in FORBIDDEN_MODULES:
                found.append(f"{filename}:{line}: imports {module}")
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name in FORBIDDEN_CALLS:
                found.append(f"{filename}:{line}: calls {name}()")
    return found


def test_records_package_does_no_io() -> None:
    files = sorted(RECORDS_DIR.glob("*.py"))
    assert {f.name for f in files} >= {
        "__init__.py",
        "batch.py",
        "builder.py",
        "compression.py",
        "reader.py",
        "varint.py",
    }
    found = [v for f in files for v in violations(f.read_text("utf-8"), f.name)]
    assert found == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import os", ["imports os"]),
        ("import os.path as p", ["imports os.path"]),
        ("from time import monotonic", ["imports time"]),
        ("from asyncio.events import get_event_loop", ["imports asyncio.events"]),
        ("import struct, socket", ["imports socket"]),
        ("def f():\n    import random\n    return random.random()", ["imports random"]),
        ("with open('x') as f:\n    pass", ["calls open()"]),
        ("import io\nio.open('x')", ["calls open()"]),
        ("m = __import__('os')", ["calls __import__()"]),
        ("import struct\nfrom . import varint\nimport zlib", []),
        ("import timeit", []),  # a prefix is not the module
    ],
)
def test_the_checker_itself(source: str, expected: list[str]) -> None:
    assert [v.split(": ", 1)[1] for v in violations(source)] == expected
