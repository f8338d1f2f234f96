"""Spark is an extra (``pip install 'tidewire[spark]'``): without pyspark and pyarrow every
Spark entry point says what to install, and nothing else ever imports them.

Each case runs in a child interpreter whose import system refuses pyspark and pyarrow as if
they were not installed, and reports on stderr every attempt to import them.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.cli._support import STARTUP_S, subprocess_env

HINT = "Spark support needs: pip install 'tidewire[spark]'"

#: Installed first in each child: the modules in BLOCKED become "not installed", loudly.
BLOCK_ONLY = textwrap.dedent(
    """
    import sys

    class _NotInstalled:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                print("IMPORT ATTEMPT", name, file=sys.stderr, flush=True)
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    for _m in [m for m in sys.modules if m.partition(".")[0] in BLOCKED]:
        del sys.modules[_m]
    sys.meta_path.insert(0, _NotInstalled())
    """
)
BLOCK = 'BLOCKED = ("pyspark", "pyarrow")\n' + BLOCK_ONLY


def run_child(
    code: str, *args: str, timeout: float = 120, block: str = BLOCK
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", block + textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=subprocess_env(),
        check=False,
    )


def test_import_tidewire_spark_says_what_to_install() -> None:
    r = run_child(
        """
        try:
            import tidewire.spark
        except ImportError as exc:
            print(type(exc).__name__, exc.name, exc, sep="|")
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (
        f"SparkMissingError|pyspark|{HINT} (not installed: pyspark, pyarrow)"
    )


def test_spark_discovery_hook_says_what_to_install() -> None:
    """Spark imports pyspark_tidewire when pyspark is there; pyarrow may still be missing."""
    r = run_child(
        """
        try:
            import pyspark_tidewire
        except ImportError as exc:
            print(exc)
        """,
        block='BLOCKED = ("pyarrow",)\n' + BLOCK_ONLY,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{HINT} (not installed: pyarrow)"


def test_export_command_says_what_to_install(tmp_path: Path) -> None:
    r = run_child(
        "from tidewire.cli import main\nmain()\n",
        "export",
        "orders",
        "--to",
        str(tmp_path / "out"),
        "--once",
    )
    assert r.returncode == 1
    assert r.stdout == ""
    lines = [line for line in r.stderr.splitlines() if not line.startswith("IMPORT ATTEMPT")]
    assert lines == [f"error: {HINT} (not installed: pyspark, pyarrow)"]
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_broker_clients_and_commands_never_import_spark(tmp_path: Path) -> None:
    """The package, the clients, the embedded broker and every command but export run with
    pyspark and pyarrow refused, and never try to import them."""
    r = run_child(
        f"""
        import tidewire, tidewire.client, tidewire.config, tidewire.embedded, tidewire.cli
        from typer.testing import CliRunner
        from tidewire.cli import app
        from tidewire.client import Producer
        from tidewire.embedded import EmbeddedBroker

        def cli(*args):
            r = CliRunner().invoke(app, list(args))
            assert r.exit_code == 0, (args, r.output)
            return r.output

        with EmbeddedBroker({str(tmp_path / "data")!r}, http_port=0).running() as eb:
            with Producer(eb.addr) as p:
                p.send("t", b"hello").result(30)
            a = ("--addr", eb.addr)
            cli("topic", "create", "orders", "--partitions", "2", *a)
            cli("topic", "list", *a)
            cli("topic", "describe", "orders", *a)
            cli("publish", "orders", "one", "--key", "k", *a)
            assert "one" in cli("consume", "orders", "--from-beginning", "--count", "1", *a)
            cli("consume", "orders", "--group", "g", "--from-beginning", "--count", "1", *a)
            cli("group", "list", *a)
            cli("group", "describe", "g", *a)
            cli("health", *a)
            cli("bench", "produce", "--messages", "200", "--topic", "bench", *a)
        cli("config", "show")
        cli("config", "init")
        for command in ("serve", "topic", "publish", "consume", "group", "health", "bench"):
            cli(command, "--help")
        loaded = sorted(m for m in sys.modules if m.partition(".")[0] in ("pyspark", "pyarrow"))
        print("loaded:", loaded)
        """,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "IMPORT ATTEMPT" not in r.stderr
    assert r.stdout.strip().endswith("loaded: []")


def test_serve_never_imports_spark(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            BLOCK + "from tidewire.cli import main\nmain()\n",
            "serve",
            "--data-dir",
            str(tmp_path / "data"),
            "--port",
            "0",
            "--http-port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=subprocess_env(),
    )
    try:
        assert proc.stdout is not None
        assert re.search(r"listening on 127\.0\.0\.1:\d+", proc.stdout.readline())
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=STARTUP_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=STARTUP_S)
    assert proc.returncode == 0, err
    assert "IMPORT ATTEMPT" not in err
