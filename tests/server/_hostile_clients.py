"""Hostile clients of the load test (test_hostile_load.py): each kind of bad connection as a
job over a raw non-blocking socket, and the driver that runs many of them at once.

Every job that leaves its connection open measures how long the broker takes to close it
after the job's last byte (an end of stream or a reset; for a client that never reads, its
TCP state leaves ESTABLISHED), and records it as a :class:`Closed`. Mutations come from the
``random.Random`` each job is given, derived from one seed.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import socket
import struct
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import msgspec

from tests.server._support import batch
from tidewire.protocol.frames import FRAME_HEADER, FrameDecoder, FrameType, encode_frame
from tidewire.protocol.messages import (
    ACKS_DURABLE,
    ACKS_LEADER,
    ACKS_NONE,
    ApiKey,
    FetchPartition,
    FetchRequest,
    ProducePartition,
    ProduceRequest,
)

__all__ = [
    "HOSTILE_AT_ONCE",
    "NEVER_READERS_AT_ONCE",
    "Closed",
    "HostileStats",
    "Target",
    "hostile_traffic",
]

#: Hostile jobs at once (beyond the bursts past max_connections).
HOSTILE_AT_ONCE = 32
#: Clients that never read, at once (the broker may hold ~1 MiB for each, by design).
NEVER_READERS_AT_ONCE = 4
#: Fetch requests a client that never reads sends (3,000 x 64 KiB = 192 MiB of answers).
NEVER_READ_REQUESTS = 3000
#: A client that never reads stops sending once the broker has taken nothing for this long.
STALL_S = 0.3
#: Connections opened and closed at once in one storm.
STORM_SIZE = 12
#: Connections past max_connections in one burst.
OVERFLOW_EXTRA = 16
#: How often a socket's TCP state is polled while waiting for a close that cannot be read.
POLL_S = 0.02
#: How long one job may take at all (s): sending, dripping and waiting for the close.
JOB_BOUND_S = 60.0
#: How long a job waits for its close past the bound, so that a late one is measured (s).
MARGIN_S = 2.0
#: Linux TCP state ESTABLISHED (include/net/tcp_states.h), the first byte of TCP_INFO.
TCP_ESTABLISHED = 1


@dataclass(frozen=True, slots=True)
class Target:
    """The broker under attack and the settings the jobs depend on."""

    port: int
    max_frame_bytes: int
    max_connections: int
    frame_timeout_s: float
    close_bound_s: float  # the longest a connection may stay open after its last byte
    hostile_topic: str  # where mutated produce requests go (1 partition)
    bulk_topic: str  # fetched by clients that never read; at least fetch_bytes in it
    fetch_bytes: int

    @property
    def drip_s(self) -> float:
        """Time between two dripped bytes: well within the frame timeout, so only the frame
        timeout (not the idle one) can end the connection."""
        return self.frame_timeout_s / 5


@dataclass(frozen=True, slots=True)
class Closed:
    """How one hostile connection ended."""

    kind: str
    close_s: float  # from its last byte to the server's close; inf: never closed
    error_frame: bool  # the connection-closing error frame arrived


@dataclass(slots=True)
class HostileStats:
    """What the hostile jobs did and saw."""

    seed: int
    #: Notified each time a job starts (``jobs_started`` grows), for pacing other work.
    progress: asyncio.Condition = field(default_factory=asyncio.Condition)
    jobs_started: int = 0
    closed: list[Closed] = field(default_factory=list)
    connections: int = 0  # every hostile connection opened
    bytes_sent: int = 0
    #: What buffering everything the hostile clients sent or asked for would have cost.
    would_buffer: int = 0
    failures: list[str] = field(default_factory=list)

    def kinds(self) -> Counter[str]:
        return Counter(c.kind for c in self.closed)


def _loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


@contextlib.asynccontextmanager
async def _connection(
    port: int, stats: HostileStats, *, rcvbuf: int | None = None
) -> AsyncIterator[socket.socket]:
    """A non-blocking TCP connection to the broker, closed on the way out."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with sock:
        if rcvbuf is not None:  # before connecting, so the window offered starts small
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        await _loop().sock_connect(sock, ("127.0.0.1", port))
        stats.connections += 1
        yield sock


def _reset(sock: socket.socket) -> None:
    """Close with a reset (RST), as a crashed peer's kernel would."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


async def _send(sock: socket.socket, data: bytes, stats: HostileStats) -> float:
    """Send ``data``, or as much as the broker takes before it closes; return when the last
    byte went."""
    stats.bytes_sent += len(data)
    stats.would_buffer += len(data)
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        await _loop().sock_sendall(sock, data)
    return time.monotonic()


async def _until_closed(
    target: Target, sock: socket.socket, kind: str, last_byte: float, wait_s: float | None = None
) -> Closed:
    """Read until the broker closes the connection (end of stream or reset), for at most
    ``wait_s`` after ``last_byte`` (by default the close bound and a margin)."""
    received = bytearray()
    deadline = last_byte + (target.close_bound_s + MARGIN_S if wait_s is None else wait_s)
    closed = False
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout_at(_loop().time() + max(0.0, deadline - time.monotonic())):
            while len(received) < 1 << 20:  # answers to a few small requests
                try:
                    chunk = await _loop().sock_recv(sock, 65536)
                except ConnectionResetError:
                    chunk = b""
                if not chunk:
                    closed = True
                    break
                received += chunk
    close_s = time.monotonic() - last_byte if closed else math.inf
    return Closed(kind, close_s, _has_error_frame(bytes(received)))


def _has_error_frame(data: bytes) -> bool:
    decoder = FrameDecoder(max_frame_bytes=1 << 30)
    decoder.receive_data(data)
    for _ in range(len(data) // 18 + 1):
        frame = decoder.next_frame()
        if frame is None:
            return False
        if frame.correlation_id == -1:
            return True
    return False


def _frame(api_key: int, corr: int, body: bytes, data: bytes = b"") -> bytes:
    return b"".join(
        bytes(b) for b in encode_frame(FrameType.REQUEST, api_key, 0, corr, body, [data])
    )


def _produce_frame(target: Target, rng: random.Random, corr: int) -> tuple[bytes, int]:
    """A real produce request to the hostile topic; returns it and where its data section
    starts."""
    data = batch([rng.randbytes(rng.randrange(1, 300)) for _ in range(rng.randrange(1, 6))])
    acks = rng.choice([ACKS_DURABLE, ACKS_LEADER, ACKS_NONE])
    body = msgspec.msgpack.encode(
        ProduceRequest(acks=acks, partitions=[ProducePartition(target.hostile_topic, 0, len(data))])
    )
    return _frame(ApiKey.PRODUCE, corr, body, data), FRAME_HEADER.size + len(body)


def _interesting_int(rng: random.Random, near: int) -> int:
    return rng.choice([-(2**31), -1, 0, 1, 13, 14, near - 1, near + 1, 1 << 20, 2**31 - 1])


def _mutate(rng: random.Random, frame: bytes, data_start: int) -> bytes:
    """One mutation of a real produce request frame."""
    out = bytearray(frame)
    op = rng.randrange(5)
    if op == 0:  # flip 1 to 4 bytes of one region: header, body or batch data
        lo, hi = rng.choice([(0, FRAME_HEADER.size), (FRAME_HEADER.size, data_start)])
        if rng.random() < 0.5:
            lo, hi = data_start, len(frame)
        for _ in range(rng.randint(1, 4)):
            out[rng.randrange(lo, hi)] ^= rng.randrange(1, 256)
    elif op == 1:  # an impossible value in a length field
        offset = rng.choice([0, 14, data_start + 8, data_start + 57])  # frame, body, batch, count
        value = _interesting_int(rng, int.from_bytes(out[offset : offset + 4], "big"))
        out[offset : offset + 4] = value.to_bytes(4, "big", signed=True)
    elif op == 2:  # random bytes inserted
        at = rng.randrange(len(out))
        out[at:at] = rng.randbytes(rng.randint(1, 64))
    elif op == 3:  # the same frame twice: a correlation id reused while maybe in flight
        out += frame
    else:  # flipped bits anywhere
        for _ in range(rng.randint(1, 8)):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


async def _garbage(target: Target, rng: random.Random, stats: HostileStats) -> None:
    async with _connection(target.port, stats) as sock:
        last = await _send(sock, rng.randbytes(rng.randint(1, 32 * 1024)), stats)
        stats.closed.append(await _until_closed(target, sock, "garbage", last))


async def _mutated(target: Target, rng: random.Random, stats: HostileStats) -> None:
    frames = []
    for corr in range(1, rng.randint(1, 3) + 1):
        frame, data_start = _produce_frame(target, rng, corr)
        frames.append(frame if rng.random() < 0.3 else _mutate(rng, frame, data_start))
    async with _connection(target.port, stats) as sock:
        last = await _send(sock, b"".join(frames), stats)
        stats.closed.append(await _until_closed(target, sock, "mutated", last))


async def _bad_length(target: Target, rng: random.Random, stats: HostileStats) -> None:
    length = rng.choice(
        [
            -(2**31),
            -1,
            0,
            5,
            13,
            target.max_frame_bytes - 3,
            2**31 - 1,
            rng.randint(target.max_frame_bytes, 2**31 - 1),
        ]
    )
    header = FRAME_HEADER.pack(length, 0, 0, ApiKey.PRODUCE, 0, 1, 0)
    stats.would_buffer += max(0, length)  # what believing the length would reserve
    async with _connection(target.port, stats) as sock:
        last = await _send(sock, header + rng.randbytes(rng.randint(0, 64)), stats)
        stats.closed.append(await _until_closed(target, sock, "bad length", last))


async def _half_sent(target: Target, rng: random.Random, stats: HostileStats) -> None:
    if rng.random() < 0.5:  # a real frame, cut
        frame, _ = _produce_frame(target, rng, 1)
        part = frame[: rng.randrange(1, len(frame))]
    else:  # a large frame announced, less than half of it sent
        length = rng.randint(target.max_frame_bytes // 4, target.max_frame_bytes - 4)
        part = FRAME_HEADER.pack(length, 0, 0, ApiKey.PRODUCE, 0, 1, 1) + rng.randbytes(
            rng.randint(0, length // 2)
        )
    async with _connection(target.port, stats) as sock:
        last = await _send(sock, part, stats)
        stats.closed.append(await _until_closed(target, sock, "half-sent", last))


async def _drip(target: Target, rng: random.Random, stats: HostileStats) -> None:
    frame, _ = _produce_frame(target, rng, 1)  # > 100 bytes: longer to drip than the frame timeout
    assert len(frame) * target.drip_s > 5 * target.frame_timeout_s
    async with _connection(target.port, stats) as sock:
        first = last = time.monotonic()
        # Dripping ends once the server closes, or at the latest after the whole frame.
        wait_s = len(frame) * target.drip_s + target.close_bound_s
        reader = asyncio.create_task(_until_closed(target, sock, "drip", first, wait_s))
        try:
            for i in range(len(frame)):
                if reader.done():
                    break
                last = await _send(sock, frame[i : i + 1], stats)
                await asyncio.wait([reader], timeout=target.drip_s)
            closed = await reader
        finally:
            reader.cancel()
        # Measured from the first byte by the reader; from the last one here.
        close_s = time.monotonic() - last if math.isfinite(closed.close_s) else math.inf
        stats.closed.append(Closed("drip", close_s, closed.error_frame))
        if closed.close_s > target.frame_timeout_s + target.close_bound_s:
            stats.failures.append(
                f"drip: a frame begun {closed.close_s:.1f} s before was not closed by the "
                f"frame timeout of {target.frame_timeout_s} s"
            )


async def _never_reads(target: Target, rng: random.Random, stats: HostileStats) -> None:
    """Fetch requests by the thousand, never a byte read. The server must stop taking them
    (its answers would pile up) and, since the client never reads the error frame, reset the
    connection: its TCP state (TCP_INFO, without reading) leaves ESTABLISHED."""
    body = msgspec.msgpack.encode(
        FetchRequest(
            max_wait_ms=0,
            max_bytes=target.fetch_bytes,
            partitions=[FetchPartition(target.bulk_topic, 0, 0, target.fetch_bytes)],
        )
    )
    requests = b"".join(_frame(ApiKey.FETCH, c, body) for c in range(1, NEVER_READ_REQUESTS + 1))
    stats.would_buffer += NEVER_READ_REQUESTS * target.fetch_bytes
    stats.bytes_sent += len(requests)
    async with _connection(target.port, stats, rcvbuf=4096) as sock:
        sent = 0
        last = time.monotonic()
        for _ in range(len(requests)):  # each turn sends a byte or more, or stalls out
            try:
                n = sock.send(requests[sent : sent + 65536])
            except BlockingIOError:
                n = 0
            except (BrokenPipeError, ConnectionResetError):
                break
            if n:
                sent += n
                last = time.monotonic()
                if sent == len(requests):
                    break
                continue
            if time.monotonic() - last > STALL_S:
                break  # the server has stopped reading
            await asyncio.sleep(POLL_S)
        deadline = last + target.close_bound_s + MARGIN_S
        close_s = math.inf
        while time.monotonic() < deadline:
            state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]
            if state != TCP_ESTABLISHED:
                close_s = time.monotonic() - last
                break
            await asyncio.sleep(POLL_S)
        stats.closed.append(Closed("never reads", close_s, error_frame=False))


async def _storm(target: Target, rng: random.Random, stats: HostileStats) -> None:
    """Connections opened and closed at once: plain close, reset, reset mid-frame, a request
    sent and the connection closed before its answer. Closed by the client, not measured."""
    frame, _ = _produce_frame(target, rng, 1)
    for _ in range(STORM_SIZE):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await _loop().sock_connect(sock, ("127.0.0.1", target.port))
            stats.connections += 1
            how = rng.randrange(4)
            if how >= 2:
                cut = frame if how == 3 else frame[: rng.randrange(1, len(frame))]
                await _send(sock, cut, stats)
            if how in {1, 2}:
                _reset(sock)
        finally:
            sock.close()


async def _overflow(target: Target, rng: random.Random, stats: HostileStats) -> None:
    """More connections at once than max_connections, held silent: those over the bound
    are closed at once, the others when idle."""
    async with contextlib.AsyncExitStack() as stack:
        opened: list[tuple[socket.socket, float]] = []
        for _ in range(target.max_connections + OVERFLOW_EXTRA):
            sock = await stack.enter_async_context(_connection(target.port, stats))
            opened.append((sock, time.monotonic()))  # silent: connecting is its last act
        closed = await asyncio.gather(*(_until_closed(target, s, "overflow", t) for s, t in opened))
        stats.closed.extend(closed)


Job = Callable[[Target, random.Random, HostileStats], Awaitable[None]]
KINDS: dict[str, tuple[Job, int]] = {  # kind -> (job, weight)
    "garbage": (_garbage, 6),
    "mutated": (_mutated, 10),
    "bad length": (_bad_length, 3),
    "half-sent": (_half_sent, 4),
    "drip": (_drip, 2),
    "never reads": (_never_reads, 1),
    "storm": (_storm, 1),
}


async def hostile_traffic(
    target: Target, jobs: int, overflow_bursts: int, stats: HostileStats
) -> None:
    """Run ``jobs`` hostile jobs, HOSTILE_AT_ONCE at a time, of kinds drawn at random by
    weight, and ``overflow_bursts`` bursts past ``max_connections`` spread among them. A job
    that fails to connect or overruns JOB_BOUND_S is recorded in ``stats.failures``."""
    rng = random.Random(stats.seed)
    at_once = asyncio.Semaphore(HOSTILE_AT_ONCE)
    never_readers = asyncio.Semaphore(NEVER_READERS_AT_ONCE)
    names = list(KINDS)
    weights = [KINDS[k][1] for k in names]
    overflow_at = {jobs * (i + 1) // (overflow_bursts + 1) for i in range(overflow_bursts)}

    async def run(
        kind: str, job: Job, job_rng: random.Random, slots: list[asyncio.Semaphore]
    ) -> None:
        try:
            async with asyncio.timeout(JOB_BOUND_S):
                await job(target, job_rng, stats)
        except (OSError, TimeoutError) as exc:
            stats.failures.append(f"{kind}: {exc!r}")
        finally:
            for s in slots:
                s.release()

    async with asyncio.TaskGroup() as tg:
        for i in range(jobs):
            job_rng = random.Random(rng.getrandbits(64))
            if i in overflow_at:
                tg.create_task(run("overflow", _overflow, job_rng, []))
            kind = rng.choices(names, weights)[0]
            slots = [at_once]
            if kind == "never reads":
                await never_readers.acquire()
                slots.append(never_readers)
            await at_once.acquire()
            tg.create_task(run(kind, KINDS[kind][0], job_rng, slots))
            stats.jobs_started += 1
            async with stats.progress:
                stats.progress.notify_all()
