"""``tidewire.records`` and ``tidewire.protocol`` do no I/O: no sockets, files, clocks, threads
or event loops (STYLE.md, rule 1), and neither does any tidewire module they import. Checked
on the source, so a lazy import inside a function is caught too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tidewire

SRC = Path(tidewire.__file__).parent
#: The pure packages, and the tidewire modules outside them they may import.
PURE = {"records": {"errors.py"}, "protocol": {"errors.py"}}

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
        "ssl",
        "signal",
        "multiprocessing",
        "concurrent",
        "datetime",
        "random",
    }
)
FORBIDDEN_CALLS = frozenset({"open", "__import__", "import_module"})
#: Files allowed one of the forbidden imports, and why: records/_impl.py reads
#: TIDEWIRE_PURE_PYTHON from os.environ once, at import, to choose the implementation.
ALLOWED = {"records/_impl.py": {"imports os"}}


def imported_modules(tree: ast.AST, package: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``tree``, at any depth."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the package
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                found.append((node.lineno, f"{base}.{node.module}" if node.module else base))
            elif node.module:
                found.append((node.lineno, node.module))
    return found


def violations(source: str, filename: str = "<source>", package: str = "pkg") -> list[str]:
    """Every forbidden import or call in ``source``, as ``file:line: what``."""
    tree = ast.parse(source, filename)
    found = [
        f"{filename}:{line}: imports {module}"
        for line, module in imported_modules(tree, package)
        if module.split(".")[0] in FORBIDDEN_MODULES
    ]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name in FORBIDDEN_CALLS:
                found.append(f"{filename}:{node.lineno}: calls {name}()")
    return found


def module_file(module: str) -> Path | None:
    """The source file of a ``tidewire.*`` module, or None for anything else."""
    parts = module.split(".")
    if parts[0] != "tidewire":
        return None
    path = SRC.joinpath(*parts[1:])
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def closure(package: str) -> dict[Path, str]:
    """Every file of ``tidewire.<package>`` and of the tidewire modules it imports,
    transitively, with the package each one's relative imports resolve against."""
    todo = [(f, f"tidewire.{package}") for f in sorted((SRC / package).glob("*.py"))]
    seen: dict[Path, str] = {}
    while todo:
        path, package = todo.pop()
        if path in seen:
            continue
        seen[path] = package
        for _, module in imported_modules(ast.parse(path.read_text("utf-8")), package):
            target = module_file(module)
            if target is not None and target not in seen:
                # a module's relative imports resolve against its directory's package
                folder = target.parent.relative_to(SRC).parts
                todo.append((target, ".".join(("tidewire", *folder))))
    return seen


@pytest.mark.parametrize("package", sorted(PURE))
def test_package_does_no_io(package: str) -> None:
    files = closure(package)
    names = {str(f.relative_to(SRC)) for f in files}
    assert f"{package}/__init__.py" in names
    assert len([n for n in names if n.startswith(f"{package}/")]) >= 4, names
    outside = {n for n in names if not n.startswith(f"{package}/")}
    assert outside <= PURE[package], f"{package} imports {outside - PURE[package]}"
    found = [
        v
        for f, pkg in files.items()
        for v in violations(f.read_text("utf-8"), str(f.relative_to(SRC)), pkg)
        if v.split(": ", 1)[1] not in ALLOWED.get(str(f.relative_to(SRC)), set())
    ]
    assert found == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import os", ["imports os"]),
        ("import os.path as p", ["imports os.path"]),
        ("from time import monotonic", ["imports time"]),
        ("from asyncio.events import get_event_loop", ["imports asyncio.events"]),
        ("import struct, socket", ["imports socket"]),
        ("import selectors\nimport threading", ["imports selectors", "imports threading"]),
        ("def f():\n    import subprocess\n    return subprocess", ["imports subprocess"]),
        ("from pathlib import Path", ["imports pathlib"]),
        ("with open('x') as f:\n    pass", ["calls open()"]),
        ("import io\nio.open('x')", ["calls open()"]),
        ("m = __import__('os')", ["calls __import__()"]),
        ("import importlib\nimportlib.import_module('os')", ["calls import_module()"]),
        ("import struct\nfrom . import frames\nimport enum", []),
        ("import timeit\nimport osmosis", []),  # a prefix is not the module
    ],
)
def test_the_checker_itself(source: str, expected: list[str]) -> None:
    assert [v.split(": ", 1)[1] for v in violations(source)] == expected


def test_relative_imports_are_resolved() -> None:
    tree = ast.parse("from . import frames\nfrom ..errors import ProtocolError\nfrom .x import y")
    assert [m for _, m in imported_modules(tree, "tidewire.protocol")] == [
        "tidewire.protocol",
        "tidewire.errors",
        "tidewire.protocol.x",
    ]
