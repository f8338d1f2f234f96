"""What transport security and authentication cost: publish throughput and p99 latency with
TLS and SCRAM against plaintext, side by side in one run, plus connection setup and HTTP
Bearer authentication.

Usage::

    python benchmarks/security_bench.py [--rounds R] [--messages N] [--rate MSG_PER_S]
        [--latency-messages M] [--connects C] [--http-requests H] [--partitions P]
        [--fsync always|interval|never] [--json]

It makes a development CA and a server certificate (``tidewire certs init``) and starts four
brokers (``tidewire serve``), each in a process of its own on free ports over a scratch data
directory, so the producer and a broker do not share one CPU-bound event loop:

- ``plain``: plaintext, authentication off;
- ``plain-auth``: plaintext, ``--authentication`` (the producer authenticates with SCRAM);
- ``tls``: TLS (``--tls-cert-file``/``--tls-key-file``), authentication off;
- ``tls-auth``: TLS and ``--authentication`` (SCRAM-SHA-256, or PLAIN over TLS).

With authentication on, the producer's key belongs to a principal with the ``producer`` role
(created through the admin API with the first superuser's key), so each request pays the
ACL check a real client pays. Every configuration then runs, in every round, in an order
that rotates from round to round:

- throughput: one :class:`~tidewire.client.AsyncProducer` sends N messages of 1 KiB as fast
  as it can (``acks=durable``, idempotent, linger 5 ms, batches of 64 KiB); the clock runs
  from the first send to the end of ``flush()``; also the broker's CPU time per message (user
  + system, all its threads, from /proc), which depends less on what else the machine runs;
- latency: M messages paced at ``--rate`` msg/s (below every configuration's capacity), from
  just before each ``send`` to its future resolving: p50 and p99.

The figures are medians over the rounds; the ratios are to ``plain``. The issue's bar is that
TLS costs at most 25% of throughput: ``TLS+SCRAM / plaintext >= 0.75``.

Then, once per configuration, C times: the connection setup of a new
:class:`~tidewire.client.AsyncClient` (TCP connect, TLS handshake, SASL exchange, one PING
answered), median and p90 ms; and, over HTTP (``GET /v1/topics`` on a keep-alive
``httpx`` connection; HTTPS on the TLS brokers): without a key where authentication is off;
with ``Authorization: Bearer`` where it is on, the first request of each of a few fresh keys
(which pays scrypt) and H later ones (verified keys are cached).

Measured on the 2-core development machine, shared with other work (the rates of single runs
swung from 28,000 to 110,000 msg/s within one round, so compare the ratios, and above all the
broker's CPU per message, which moves least)::

    python benchmarks/security_bench.py --rounds 7 --messages 50000

    setup                       msg/s   MB/s  ratio paired µs/msg cpu x  p50 ms p99 ms connect ms
    plaintext                  71,889   73.6   1.00   1.00    6.2  1.00    4.99  10.59      0.77
    plaintext + SCRAM-SHA-256  78,051   79.9   1.09   0.89    6.2  1.00    4.81   9.55      4.76
    TLS                        69,987   71.7   0.97   1.12    7.0  1.13    4.90  10.16      6.00
    TLS + SCRAM-SHA-256        54,716   56.0   0.76   1.22    8.0  1.29    5.24  10.19     12.99
    TLS + PLAIN                62,186   63.7   0.87   0.96    7.8  1.26    5.32  11.90      5.36

    HTTP GET /v1/topics                          median ms  p90 ms    n
    plain: no key                                     1.43    4.09  300
    plain-auth: Bearer, first request of a key       50.00   62.89    8
    plain-auth: Bearer, later requests                1.21    1.74  300
    tls: no key                                       1.14    2.61  300
    tls-auth: Bearer, first request of a key         71.44  137.08    8
    tls-auth: Bearer, later requests                  1.67    2.84  300

    TLS + SCRAM-SHA-256 / plaintext: throughput 0.76 (paired 1.22), broker CPU per message 1.29x

A run just before it with the same command: TLS + SCRAM-SHA-256 / plaintext throughput 0.84
(paired 0.85), broker CPU per message 1.24x (7.2 against 5.8 µs); p99 at 5,000 msg/s 14.7
against 11.4 ms; connection setup 9.8 against 0.6 ms. So TLS with SCRAM costs the broker some
25-30% more CPU per message (SCRAM itself nothing per message: it is paid once per connection,
some 3-5 ms, mostly the client's PBKDF2), and the throughput ratio sat at 0.76-0.84 in these
runs: within the issue's bar of 0.75, not by much. A key's first HTTP request pays scrypt
(50-110 ms), later ones are verified from the cache and cost what a request without a key
costs (~1.2-1.5 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from producer_bench import ServedBroker, serve
from tidewire.client import AsyncClient, AsyncProducer, Credentials, TlsOptions

VALUE_BYTES = 1024
TOPIC = "bench"
#: The issue's bar: TLS + SCRAM keeps at least this share of plaintext's throughput.
BAR = 0.75
#: Fresh keys whose first HTTP request (scrypt) is timed.
FIRST_BEARER_KEYS = 8


@dataclass(frozen=True)
class Setup:
    """One broker configuration and how a client talks to it."""

    name: str  # the row's label
    broker: str  # which broker: plain, plain-auth, tls, tls-auth
    mechanism: str | None  # SASL mechanism (None: no authentication)


SETUPS = [
    Setup("plaintext", "plain", None),
    Setup("plaintext + SCRAM-SHA-256", "plain-auth", "SCRAM-SHA-256"),
    Setup("TLS", "tls", None),
    Setup("TLS + SCRAM-SHA-256", "tls-auth", "SCRAM-SHA-256"),
    Setup("TLS + PLAIN", "tls-auth", "PLAIN"),
]


@dataclass
class Broker:
    """A running broker: its address, and what a client needs to reach it."""

    served: ServedBroker
    tls: TlsOptions | None
    key: str | None  # the producer principal's API key (authentication on)
    admin_key: str | None

    def credentials(self, mechanism: str | None) -> Credentials | None:
        if mechanism is None or self.key is None:
            return None
        return Credentials(self.key, mechanism)

    def cpu_s(self) -> float:
        """The broker process's CPU time so far (user + system, every thread), seconds."""
        fields = Path(f"/proc/{self.served.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Figures:
    """One configuration's measurements over the rounds."""

    rates: list[float] = field(default_factory=list)  # msg/s
    cpu_us: list[float] = field(default_factory=list)  # broker CPU µs per message
    p50_ms: list[float] = field(default_factory=list)
    p99_ms: list[float] = field(default_factory=list)
    connect_ms: list[float] = field(default_factory=list)


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(int(q * len(s)), len(s) - 1)]


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- the brokers ---------------------------------------------------------------------------------


def make_certs(directory: Path) -> TlsOptions:
    """``tidewire certs init``: a CA and a certificate for 127.0.0.1; the client's options."""
    subprocess.run(
        [sys.executable, "-m", "tidewire", "certs", "init", str(directory), "--json"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return TlsOptions(ca_file=str(directory / "ca.pem"))


async def _provision(addr: str, admin_key: str, tls: TlsOptions | None) -> str:
    """A principal with the producer role, and its key."""
    creds = Credentials(admin_key)
    async with AsyncClient(addr, credentials=creds, tls=tls) as admin:
        await admin.create_principal("bench", kind="service", roles=["producer"])
        _, key = await admin.create_api_key("bench", description="security_bench")
        return key


async def _create_topic(addr: str, partitions: int, creds: Credentials | None, tls: Any) -> None:
    async with AsyncClient(addr, credentials=creds, tls=tls) as client:
        await client.create_topic(TOPIC, partitions=partitions)


@contextmanager
def brokers(args: argparse.Namespace, scratch: Path) -> Iterator[dict[str, Broker]]:
    client_tls = make_certs(scratch / "pki")
    server_tls = (
        "--tls-cert-file",
        str(scratch / "pki" / "server.pem"),
        "--tls-key-file",
        str(scratch / "pki" / "server.key"),
    )
    auth = ("--authentication", "--superusers", "admin")
    common = (
        *("--fsync", args.fsync, "--partitions", str(args.partitions)),
        *("--http-allowed-hosts", "*"),
    )
    flags = {
        "plain": (),
        "plain-auth": auth,
        "tls": server_tls,
        "tls-auth": (*server_tls, *auth),
    }
    out: dict[str, Broker] = {}
    with ExitStack() as stack:
        for name, extra in flags.items():
            served = stack.enter_context(serve(*common, *extra, http=True))
            tls = client_tls if "tls" in name else None
            admin_key = None
            key = None
            if "auth" in name:
                admin_key = (Path(served.data_dir) / "bootstrap-admin.key").read_text().strip()
                key = asyncio.run(_provision(served.addr, admin_key, tls))
            creds = Credentials(admin_key) if admin_key else None
            asyncio.run(_create_topic(served.addr, args.partitions, creds, tls))
            out[name] = Broker(served, tls, key, admin_key)
            progress(f"broker {name} on {served.addr} (HTTP {served.http}), pid {served.pid}")
        yield out


# --- publishing ----------------------------------------------------------------------------------


def _producer(b: Broker, s: Setup) -> AsyncProducer:
    return AsyncProducer(
        b.served.addr,
        acks="durable",
        linger_ms=5,
        batch_bytes=64 * 1024,
        tls=b.tls,
        credentials=b.credentials(s.mechanism),
    )


async def throughput(b: Broker, s: Setup, n: int) -> tuple[float, float]:
    """msg/s of n messages as fast as they go, and the broker's CPU seconds for them."""
    value = os.urandom(VALUE_BYTES // 2).hex().encode()
    async with _producer(b, s) as producer:
        await (await producer.send(TOPIC, value))  # connects and authenticates, untimed
        cpu0 = b.cpu_s()
        start = time.perf_counter()
        for _ in range(n):
            fut = await producer.send(TOPIC, value)
        await producer.flush()
        elapsed = time.perf_counter() - start
        cpu = b.cpu_s() - cpu0
        await fut
    return n / elapsed, cpu


async def latency(b: Broker, s: Setup, n: int, rate: float) -> list[float]:
    """Publish latencies (s) of n messages paced at ``rate`` msg/s."""
    value = os.urandom(VALUE_BYTES // 2).hex().encode()
    clock = time.perf_counter
    out: list[float] = []
    async with _producer(b, s) as producer:
        await (await producer.send(TOPIC, value))
        start = clock()
        sent = 0
        while sent < n:
            due = min(int((clock() - start) * rate) + 1, n)
            while sent < due:
                t0 = clock()
                fut = await producer.send(TOPIC, value)
                fut.add_done_callback(lambda _, t0=t0: out.append(clock() - t0))
                sent += 1
            await asyncio.sleep(0.001)
        await producer.flush()
        await fut
    return out


async def connects(b: Broker, s: Setup, n: int) -> list[float]:
    """Seconds from a new client's first request to its answer (connect, TLS handshake,
    SASL, PING), n times."""
    out = []
    for _ in range(n):
        # Made before the clock starts: a client builds its TLS context once, and every
        # connection it opens (a reconnect too) reuses it.
        client = AsyncClient(b.served.addr, tls=b.tls, credentials=b.credentials(s.mechanism))
        async with client:
            t0 = time.perf_counter()
            await client.ping()
            out.append(time.perf_counter() - t0)
    return out


# --- HTTP ----------------------------------------------------------------------------------------


def http_latencies(b: Broker, n: int) -> dict[str, list[float]]:
    """``GET /v1/topics`` latencies (s): with Bearer (first request of fresh keys, and
    later ones) where authentication is on, else without a key."""
    scheme = "https" if b.tls is not None else "http"
    verify: Any = b.tls.ca_file if b.tls is not None else True
    url = f"{scheme}://{b.served.http}"
    out: dict[str, list[float]] = {}

    def timed(client: httpx.Client, headers: dict[str, str]) -> float:
        t0 = time.perf_counter()
        r = client.get("/v1/topics", headers=headers)
        dt = time.perf_counter() - t0
        if r.status_code != 200:
            raise SystemExit(f"GET /v1/topics answered {r.status_code}: {r.text[:200]}")
        return dt

    with httpx.Client(base_url=url, verify=verify) as client:
        client.get("/v1/topics")  # opens the connection, untimed (401 with authentication)
        if b.key is None:
            out["no key"] = [timed(client, {}) for _ in range(n)]
            return out
        fresh = asyncio.run(_fresh_keys(b, FIRST_BEARER_KEYS))
        out["Bearer, first request of a key"] = [
            timed(client, {"authorization": f"Bearer {k}"}) for k in fresh
        ]
        auth = {"authorization": f"Bearer {b.key}"}
        timed(client, auth)
        out["Bearer, later requests"] = [timed(client, auth) for _ in range(n)]
    return out


async def _fresh_keys(b: Broker, n: int) -> list[str]:
    assert b.admin_key is not None
    async with AsyncClient(b.served.addr, credentials=Credentials(b.admin_key), tls=b.tls) as c:
        return [(await c.create_api_key("bench", description="first request"))[1] for _ in range(n)]


# --- the run -------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="each configuration, each round")
    ap.add_argument("--messages", type=int, default=100_000, help="per throughput run")
    ap.add_argument("--rate", type=float, default=5_000, help="msg/s of the latency runs")
    ap.add_argument("--latency-messages", type=int, default=10_000, help="per latency run")
    ap.add_argument("--connects", type=int, default=50, help="new connections timed per setup")
    ap.add_argument("--http-requests", type=int, default=300, help="GET /v1/topics per broker")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--fsync", choices=["always", "interval", "never"], default="interval")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    for name in ("rounds", "messages", "rate", "latency_messages", "connects", "http_requests"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be > 0")

    figures = {s.name: Figures() for s in SETUPS}
    http: dict[str, dict[str, list[float]]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="tidewire-secbench-") as scratch,
        brokers(args, Path(scratch)) as running,
    ):
        for r in range(args.rounds):
            order = SETUPS[r % len(SETUPS) :] + SETUPS[: r % len(SETUPS)]
            for s in order:
                b = running[s.broker]
                rate, cpu = asyncio.run(throughput(b, s, args.messages))
                lat = asyncio.run(latency(b, s, args.latency_messages, args.rate))
                f = figures[s.name]
                f.rates.append(rate)
                f.cpu_us.append(cpu / args.messages * 1e6)
                f.p50_ms.append(quantile(lat, 0.50) * 1000)
                f.p99_ms.append(quantile(lat, 0.99) * 1000)
                progress(
                    f"round {r + 1}/{args.rounds} {s.name}: {rate:,.0f} msg/s, broker "
                    f"{f.cpu_us[-1]:.1f} µs/msg; at {args.rate:,.0f} msg/s p99 "
                    f"{f.p99_ms[-1]:.2f} ms"
                )
        for s in SETUPS:
            b = running[s.broker]
            figures[s.name].connect_ms = [
                x * 1000 for x in asyncio.run(connects(b, s, args.connects))
            ]
            progress(
                f"connection setup {s.name}: {statistics.median(figures[s.name].connect_ms):.2f} ms"
            )
        for name in ("plain", "plain-auth", "tls", "tls-auth"):
            http[name] = http_latencies(running[name], args.http_requests)
            progress(f"HTTP {name}: done")
    report(args, figures, http)


def report(
    args: argparse.Namespace, figures: dict[str, Figures], http: dict[str, dict[str, list[float]]]
) -> None:
    med: Callable[[list[float]], float] = statistics.median
    base = figures[SETUPS[0].name]
    rows = []
    for s in SETUPS:
        f = figures[s.name]
        rows.append(
            {
                "setup": s.name,
                "msg_per_s": med(f.rates),
                "mb_per_s": med(f.rates) * VALUE_BYTES / 1e6,
                "throughput_ratio": med(f.rates) / med(base.rates),
                # Each round's rate over plaintext's in the same round, then the median: the
                # load of a shared machine drifts less within a round than across rounds.
                "paired_ratio": med([x / y for x, y in zip(f.rates, base.rates, strict=True)]),
                "broker_cpu_us_per_msg": med(f.cpu_us),
                "broker_cpu_ratio": med(f.cpu_us) / med(base.cpu_us),
                "p50_ms": med(f.p50_ms),
                "p99_ms": med(f.p99_ms),
                "p99_ratio": med(f.p99_ms) / med(base.p99_ms),
                "connect_ms": med(f.connect_ms),
                "connect_p90_ms": quantile(f.connect_ms, 0.9),
                "rounds": {"msg_per_s": f.rates, "p99_ms": f.p99_ms},
            }
        )
    http_rows = [
        {
            "broker": name,
            "request": what,
            "median_ms": med(xs) * 1000,
            "p90_ms": quantile(xs, 0.9) * 1000,
            "n": len(xs),
        }
        for name, kinds in http.items()
        for what, xs in kinds.items()
    ]
    tls_scram = next(r for r in rows if r["setup"] == "TLS + SCRAM-SHA-256")
    verdict = {
        "tls_scram_over_plaintext": tls_scram["throughput_ratio"],
        "tls_scram_over_plaintext_paired": tls_scram["paired_ratio"],
        "tls_scram_broker_cpu_ratio": tls_scram["broker_cpu_ratio"],
        "bar": BAR,
        "meets_bar": tls_scram["throughput_ratio"] >= BAR and tls_scram["paired_ratio"] >= BAR,
    }
    settings = {
        "rounds": args.rounds,
        "messages": args.messages,
        "value_bytes": VALUE_BYTES,
        "latency_rate": args.rate,
        "latency_messages": args.latency_messages,
        "partitions": args.partitions,
        "fsync": args.fsync,
        "connects": args.connects,
        "http_requests": args.http_requests,
    }
    if args.json:
        print(
            json.dumps(
                {"settings": settings, "publish": rows, "http": http_rows, "verdict": verdict},
                indent=2,
            )
        )
        return
    print(
        f"\nAsyncProducer, {args.messages:,} x {VALUE_BYTES} B per run, acks=durable, "
        f"fsync={args.fsync}, {args.partitions} partitions; p50/p99 paced at "
        f"{args.rate:,.0f} msg/s; medians of {args.rounds} rounds\n"
    )
    print(
        f"{'setup':<27} {'msg/s':>9} {'MB/s':>7} {'ratio':>6} {'paired':>6} {'µs/msg':>7} "
        f"{'cpu x':>6} {'p50 ms':>7} {'p99 ms':>7} {'p99 x':>6} {'connect ms':>11}"
    )
    for r in rows:
        print(
            f"{r['setup']:<27} {r['msg_per_s']:>9,.0f} {r['mb_per_s']:>7.1f} "
            f"{r['throughput_ratio']:>6.2f} {r['paired_ratio']:>6.2f} "
            f"{r['broker_cpu_us_per_msg']:>7.1f} "
            f"{r['broker_cpu_ratio']:>6.2f} {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} "
            f"{r['p99_ratio']:>6.2f} {r['connect_ms']:>11.2f}"
        )
    print(
        "\n(ratio: median throughput / plaintext's; paired: the median of each round's ratio; "
        "µs/msg: the broker's CPU per message; "
        "connect: a new client's connect + TLS + SASL + first PING)\n"
    )
    print(f"{'HTTP GET /v1/topics':<48} {'median ms':>10} {'p90 ms':>8} {'n':>5}")
    for h in http_rows:
        print(
            f"{h['broker'] + ': ' + h['request']:<48} {h['median_ms']:>10.2f} "
            f"{h['p90_ms']:>8.2f} {h['n']:>5}"
        )
    ok = "meets" if verdict["meets_bar"] else "MISSES"
    print(
        f"\nTLS + SCRAM-SHA-256 / plaintext: throughput {verdict['tls_scram_over_plaintext']:.2f}"
        f" (paired {verdict['tls_scram_over_plaintext_paired']:.2f}), broker CPU per message "
        f"{verdict['tls_scram_broker_cpu_ratio']:.2f}x "
        f"({ok} the bar of >= {BAR:.2f}: TLS costs at most 25%)"
    )


if __name__ == "__main__":
    main()
