"""setup.py's optional extension: without a working C compiler the build still succeeds,
with no compiled module (the package then runs the pure-Python codec); with one, it builds
the module. Run on the checkout's setup.py into temporary build directories."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("Cython")


def build_ext(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], list[Path]]:
    lib, temp = tmp_path / "lib", tmp_path / "temp"
    done = subprocess.run(
        [
            sys.executable,
            "setup.py",
            "build_ext",
            "--build-lib",
            str(lib),
            "--build-temp",
            str(temp),
        ],
        cwd=ROOT,
        env=os.environ | env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return done, sorted(lib.rglob("_speedups*.so")) if lib.exists() else []


def test_without_a_compiler_the_build_goes_on_without_the_module(tmp_path: Path) -> None:
    done, built = build_ext(tmp_path, CC="/bin/false", LDSHARED="/bin/false")
    assert done.returncode == 0, done.stderr
    assert built == []
    assert 'building extension "tidewire.records._speedups" failed' in done.stdout + done.stderr


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler here")
def test_with_a_compiler_the_module_is_built(tmp_path: Path) -> None:
    done, built = build_ext(tmp_path)
    assert done.returncode == 0, done.stderr
    assert [p.name.split(".")[0] for p in built] == ["_speedups"]
