"""scripts/serve installs only when .venv is missing or pyproject.toml changed since its last
install. Run on a copy of the script beside a fake .venv whose python records each pip run."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_checkout(tmp_path: Path) -> Path:
    """A checkout with scripts/serve, a pyproject.toml and a .venv whose python and tidewire
    only record how they were called."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "serve", root / "scripts" / "serve")
    (root / "pyproject.toml").write_text('[project]\nname = "tidewire"\n')
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("python", "tidewire"):
        fake = bin_dir / name
        fake.write_text(f'#!/bin/sh\necho "{name} $*" >> "$(dirname "$0")/../calls"\n')
        fake.chmod(0o755)
    return root


def serve(root: Path, *, check: bool = True) -> list[str]:
    """Run scripts/serve --help; return the calls it made."""
    calls = root / ".venv" / "calls"
    calls.unlink(missing_ok=True)
    subprocess.run(
        ["bash", str(root / "scripts" / "serve"), "--help"], check=check, timeout=60, cwd="/"
    )
    return calls.read_text().splitlines()


def test_installs_once_then_only_when_pyproject_changes(tmp_path: Path) -> None:
    root = make_checkout(tmp_path)
    install = "python -m pip install --quiet -e .[dev,spark,otel]"
    assert serve(root) == [install, "tidewire serve --help"]
    assert serve(root) == ["tidewire serve --help"]  # installed: no pip run
    (root / "pyproject.toml").write_text('[project]\nname = "tidewire"\nversion = "2"\n')
    assert serve(root) == [install, "tidewire serve --help"]
    assert serve(root) == ["tidewire serve --help"]
    # A venv without the command installs (the fake pip installs nothing, so exec fails).
    (root / ".venv" / "bin" / "tidewire").unlink()
    assert serve(root, check=False) == [install]


def test_data_directory_is_ignored_by_git() -> None:
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert "/tidewire-data/" in ignored
