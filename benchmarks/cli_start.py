"""How long the ``tidewire`` command takes to start: a command that needs no broker, a client
command against a broker, and ``tidewire serve`` until it listens.

Usage::

    python benchmarks/cli_start.py [--reps 5] [--json]

Each command runs ``--reps`` times as ``python -m tidewire ...`` (the ``tidewire`` this Python
imports; ``PYTHONPATH`` is passed on), wall time from the start of the process to its exit
(for ``serve``: to its "listening" line). Prints the median and the range of each. Progress
goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TIDEWIRE = [sys.executable, "-m", "tidewire"]


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def start_serve(data: Path) -> tuple[subprocess.Popen[str], float, str]:
    """``tidewire serve`` on a free port: the process, seconds until it listened, its
    address."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [*TIDEWIRE, "serve", "--data-dir", str(data), "--port", "0", "--http-port", "-1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    took = time.perf_counter() - started
    m = re.search(r"listening on ([\d.]+:\d+)", line)
    if m is None:
        stop(proc)
        raise SystemExit(f"serve did not start: {line!r}")
    return proc, took, m.group(1)


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)
    if proc.stdout is not None:
        proc.stdout.close()


def timed(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, capture_output=True, check=True, timeout=120)
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.reps < 1:
        ap.error(f"--reps={args.reps} must be at least 1")
    times: dict[str, list[float]] = {"--version": [], "topic list": [], "serve": []}
    with tempfile.TemporaryDirectory(prefix="tidewire-cli-start-") as tmp:
        broker, _, addr = start_serve(Path(tmp) / "broker")
        try:
            for i in range(args.reps):
                say(f"rep {i + 1}/{args.reps}")
                times["--version"].append(timed([*TIDEWIRE, "--version"]))
                times["topic list"].append(timed([*TIDEWIRE, "topic", "list", "--addr", addr]))
                proc, took, _ = start_serve(Path(tmp) / f"serve-{i}")
                stop(proc)
                times["serve"].append(took)
        finally:
            stop(broker)
    out = {
        name: {
            "median_s": statistics.median(xs),
            "min_s": min(xs),
            "max_s": max(xs),
            "runs": len(xs),
        }
        for name, xs in times.items()
    }
    if args.json:
        print(json.dumps(out))
        return
    for name, s in out.items():
        print(
            f"tidewire {name:<12} median {s['median_s']:.2f} s "
            f"[{s['min_s']:.2f}-{s['max_s']:.2f}], {s['runs']} runs"
        )


if __name__ == "__main__":
    main()
