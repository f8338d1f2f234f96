"""Routing decisions per second of the queues' Router, per exchange type.

    python benchmarks/routing_bench.py [--bindings N] [--seconds S]

direct: N bindings of distinct keys, routed by a key that one matches; fanout: N bindings;
topic: N patterns (a third ``x.<i>.*``, a third ``x.#.<i>``, a third ``*.<i>.#``), routed
by keys from a working set of 1,000 (answered mostly from the per-exchange cache) and by
keys never seen (a walk of the trie each); headers: N bindings, linear.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from tidewire.broker.queues.model import Binding, ExchangeSpec
from tidewire.broker.queues.routing import Router


def rate(label: str, fn: Callable[[int], object], seconds: float) -> None:
    n = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for i in range(1000):
            fn(n + i)
        n += 1000
    elapsed = time.perf_counter() - start
    print(f"{label:<34} {n / elapsed:>12,.0f} routes/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bindings", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=1.0)
    args = ap.parse_args()
    n, s = args.bindings, args.seconds
    r = Router(lambda name: name == "q0")
    for t in ("direct", "fanout", "topic", "headers"):
        r.add_exchange(ExchangeSpec(t, t))
    for i in range(n):
        r.add_binding(Binding("direct", f"q{i}", "queue", f"k{i}"))
        r.add_binding(Binding("fanout", f"q{i}", "queue"))
        pattern = (f"x.{i}.*", f"x.#.{i}", f"*.{i}.#")[i % 3]
        r.add_binding(Binding("topic", f"q{i}", "queue", pattern))
        r.add_binding(Binding("headers", f"q{i}", "queue", "", (("h", str(i)),)))
    print(f"{n:,} bindings per exchange")
    rate("default exchange", lambda i: r.route("", "q0", {}), s)
    rate("direct", lambda i: r.route("direct", f"k{i % n}", {}), s)
    rate("fanout", lambda i: r.route("fanout", "", {}), s)
    rate("topic, 1,000 keys (cached)", lambda i: r.route("topic", f"x.{i % 1000}.y", {}), s)
    rate("topic, new keys (trie walk)", lambda i: r.route("topic", f"x.{i}.y.z", {}), s)
    rate("headers", lambda i: r.route("headers", "", {"h": str(i % n)}), s)


if __name__ == "__main__":
    main()
