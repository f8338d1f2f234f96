"""A small asyncio client of etcd v3 through its JSON gateway (``/v3/...``), the store every
decision of a tidewire cluster about who leads goes through.

It covers what the cluster needs and nothing else: keys (range, put, delete), transactions
with compares (every metadata change is a compare-and-swap), leases (a node's registration
lives on one), watches (metadata caches follow the store from a revision) and elections (one
controller at a time). etcd's gateway speaks JSON over HTTP/1.1; keys and values are bytes,
base64 on the wire; 64-bit integers are strings; fields at their zero value are left out.

Jepsen found etcd's key-value operations and transactions strict-serializable but its locks
(and so an election alone) unable to guarantee mutual exclusion: a leader that paused past its
lease can still act. The election's revision is therefore a fencing token: a controller compares
it in every write (:meth:`Compare.create_revision` of its leader key), so a deposed controller's
writes fail instead of landing.

Errors: :class:`EtcdUnavailableError` when no endpoint answers (retriable: the caller keeps
what it has and tries again), :class:`EtcdError` for an answer etcd refused (with its gRPC code
and message), :class:`WatchCompactedError` when a watch's start revision was compacted away
(the caller reads the keys anew and watches from the revision of that read).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from tidewire.cluster.metrics import EtcdStats
from tidewire.errors import TidewireError

__all__ = [
    "Compare",
    "EtcdClient",
    "EtcdError",
    "EtcdUnavailableError",
    "KeyValue",
    "LeaderKey",
    "Lease",
    "Op",
    "TxnResult",
    "WatchCompactedError",
    "WatchEvent",
    "prefix_end",
]

log = logging.getLogger("tidewire.cluster.etcd")

#: gRPC status codes etcd answers with (the gateway puts them in ``code``).
GRPC_NOT_FOUND = 5
GRPC_FAILED_PRECONDITION = 9
GRPC_UNAVAILABLE = 14

#: A lease past its TTL with etcd not answering (``Lease.stale``) is renewed at least this
#: often (s), so that its holder learns within about a second that etcd is back.
STALE_RETRY_S = 1.0


class EtcdError(TidewireError):
    """etcd refused a request: ``grpc_code`` is its gRPC status, the message its words."""

    def __init__(self, message: str, grpc_code: int = 0) -> None:
        super().__init__(message)
        self.grpc_code = grpc_code


class EtcdUnavailableError(EtcdError):
    """No endpoint of the etcd cluster answered (retriable)."""

    retriable = True


class WatchCompactedError(EtcdError):
    """A watch started at a revision etcd has compacted away; ``compact_revision`` is the
    oldest it still has."""

    def __init__(self, message: str, compact_revision: int) -> None:
        super().__init__(message)
        self.compact_revision = compact_revision


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def _unb64(s: str | None) -> bytes:
    return base64.b64decode(s) if s else b""


def _key(k: str | bytes) -> bytes:
    return k.encode() if isinstance(k, str) else k


def _key_range(key: str | bytes, prefix: bool) -> dict[str, Any]:
    """The ``key`` (and ``range_end`` for every key under it as a prefix) of a request."""
    k = _key(key)
    body: dict[str, Any] = {"key": _b64(k)}
    if prefix:
        body["range_end"] = _b64(prefix_end(k))
    return body


def prefix_end(prefix: bytes) -> bytes:
    """The end of the range of every key starting with ``prefix`` (etcd's ``range_end``):
    the prefix with its last byte below 0xff incremented, the rest dropped."""
    p = bytearray(prefix)
    while p:
        if p[-1] < 0xFF:
            p[-1] += 1
            return bytes(p)
        p.pop()
    return b"\x00"  # every key


@dataclass(frozen=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @classmethod
    def of(cls, d: dict[str, Any]) -> KeyValue:
        return cls(
            _unb64(d.get("key")),
            _unb64(d.get("value")),
            int(d.get("create_revision", 0)),
            int(d.get("mod_revision", 0)),
            int(d.get("version", 0)),
            int(d.get("lease", 0)),
        )


_RESULTS = {"=": "EQUAL", "!=": "NOT_EQUAL", "<": "LESS", ">": "GREATER"}


@dataclass(frozen=True)
class Compare:
    """One condition of a transaction, on one key."""

    target: Literal["VERSION", "CREATE", "MOD", "VALUE", "LEASE"]
    field: str
    key: bytes
    op: Literal["=", "!=", "<", ">"]
    value: int | bytes

    @classmethod
    def create_revision(
        cls, key: str | bytes, op: Literal["=", "!=", "<", ">"], rev: int
    ) -> Compare:
        """``0`` with ``=``: the key does not exist."""
        return cls("CREATE", "create_revision", _key(key), op, rev)

    @classmethod
    def mod_revision(cls, key: str | bytes, op: Literal["=", "!=", "<", ">"], rev: int) -> Compare:
        return cls("MOD", "mod_revision", _key(key), op, rev)

    @classmethod
    def version(cls, key: str | bytes, op: Literal["=", "!=", "<", ">"], version: int) -> Compare:
        return cls("VERSION", "version", _key(key), op, version)

    @classmethod
    def value_is(cls, key: str | bytes, op: Literal["=", "!=", "<", ">"], value: bytes) -> Compare:
        return cls("VALUE", "value", _key(key), op, value)

    def to_json(self) -> dict[str, Any]:
        v = _b64(self.value) if isinstance(self.value, bytes) else str(self.value)
        return {
            "result": _RESULTS[self.op],
            "target": self.target,
            "key": _b64(self.key),
            self.field: v,
        }


@dataclass(frozen=True)
class Op:
    """One request inside a transaction: a put, a delete or a range read."""

    kind: Literal["put", "delete", "range"]
    key: bytes
    value: bytes = b""
    lease: int = 0
    range_end: bytes = b""

    @classmethod
    def put(cls, key: str | bytes, value: bytes, lease: int = 0) -> Op:
        return cls("put", _key(key), value, lease)

    @classmethod
    def delete(cls, key: str | bytes, *, prefix: bool = False) -> Op:
        k = _key(key)
        return cls("delete", k, range_end=prefix_end(k) if prefix else b"")

    @classmethod
    def get(cls, key: str | bytes, *, prefix: bool = False) -> Op:
        k = _key(key)
        return cls("range", k, range_end=prefix_end(k) if prefix else b"")

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"key": _b64(self.key)}
        if self.kind == "put":
            body["value"] = _b64(self.value)
            if self.lease:
                body["lease"] = str(self.lease)
            return {"request_put": body}
        if self.range_end:
            body["range_end"] = _b64(self.range_end)
        return {"request_delete_range" if self.kind == "delete" else "request_range": body}


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int
    #: per op of the branch that ran: the key-values a range read, else empty
    responses: list[list[KeyValue]]


@dataclass(frozen=True)
class WatchEvent:
    type: Literal["PUT", "DELETE"]
    kv: KeyValue


@dataclass(frozen=True)
class LeaderKey:
    """What a won election gives: the key whose ``rev`` is the fencing token."""

    name: bytes
    key: bytes
    rev: int
    lease: int

    def to_json(self) -> dict[str, Any]:
        return {
            "name": _b64(self.name),
            "key": _b64(self.key),
            "rev": str(self.rev),
            "lease": str(self.lease),
        }


class EtcdClient:
    """Requests to one etcd cluster through any of ``endpoints`` (``http://host:port``),
    the one that answered last first.

    Args:
        endpoints: the cluster's client URLs.
        timeout_s: bound of each request (watches and campaigns wait longer, see there).
    """

    def __init__(self, endpoints: Sequence[str], *, timeout_s: float = 5.0) -> None:
        if not endpoints:
            raise ValueError("an etcd client needs at least one endpoint")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.timeout_s = timeout_s
        self._http = httpx.AsyncClient(timeout=timeout_s)
        #: Requests, failures and latency by op (the node's metrics).
        self.stats = EtcdStats()

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> EtcdClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- plumbing ----------------------------------------------------------------------------

    async def _post(self, path: str, body: dict[str, Any], timeout_s: float | None = None) -> Any:
        started = time.monotonic()
        ok = False
        try:
            got = await self._post_any(path, body, timeout_s)
            ok = True
            return got
        finally:
            self.stats.observe(path, time.monotonic() - started, ok=ok)

    async def _post_any(self, path: str, body: dict[str, Any], timeout_s: float | None) -> Any:
        last: Exception | None = None
        for i, base in enumerate(list(self.endpoints)):
            try:
                r = await self._http.post(
                    base + path, json=body, timeout=timeout_s or self.timeout_s
                )
            except httpx.TransportError as exc:  # refused, reset, timed out: the next one
                last = exc
                continue
            if i:  # answered: try it first next time
                self.endpoints.remove(base)
                self.endpoints.insert(0, base)
            return self._answer(path, r.status_code, r.content)
        raise EtcdUnavailableError(
            f"no etcd endpoint answered {path} ({', '.join(self.endpoints)}): {last!r}",
            GRPC_UNAVAILABLE,
        )

    @staticmethod
    def _answer(path: str, status: int, content: bytes) -> Any:
        try:
            doc = json.loads(content)
        except ValueError:
            raise EtcdError(
                f"etcd answered {path} with {status} and no JSON: {content[:200]!r}"
            ) from None
        if status != 200 or "error" in doc:
            code = int(doc.get("code", 0))
            cls = EtcdUnavailableError if code == GRPC_UNAVAILABLE else EtcdError
            raise cls(f"etcd refused {path}: {doc.get('message') or doc.get('error')}", code)
        return doc

    # --- keys --------------------------------------------------------------------------------

    async def get(self, key: str | bytes) -> KeyValue | None:
        kvs, _ = await self.range(key)
        return kvs[0] if kvs else None

    async def range(
        self, key: str | bytes, *, prefix: bool = False, revision: int = 0
    ) -> tuple[list[KeyValue], int]:
        """The key (or every key under the prefix) and the store's revision of the read."""
        body = _key_range(key, prefix)
        if revision:
            body["revision"] = str(revision)
        doc = await self._post("/v3/kv/range", body)
        return [KeyValue.of(d) for d in doc.get("kvs", ())], int(doc["header"]["revision"])

    async def put(self, key: str | bytes, value: bytes, *, lease: int = 0) -> int:
        """The revision the put made."""
        body: dict[str, Any] = {"key": _b64(_key(key)), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        doc = await self._post("/v3/kv/put", body)
        return int(doc["header"]["revision"])

    async def delete(self, key: str | bytes, *, prefix: bool = False) -> int:
        """How many keys were deleted."""
        doc = await self._post("/v3/kv/deleterange", _key_range(key, prefix))
        return int(doc.get("deleted", 0))

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        """Run ``success`` if every compare holds, else ``failure``, atomically."""
        doc = await self._post(
            "/v3/kv/txn",
            {
                "compare": [c.to_json() for c in compares],
                "success": [o.to_json() for o in success],
                "failure": [o.to_json() for o in failure],
            },
        )
        responses = [
            [KeyValue.of(d) for d in r.get("response_range", {}).get("kvs", ())]
            for r in doc.get("responses", ())
        ]
        return TxnResult(bool(doc.get("succeeded")), int(doc["header"]["revision"]), responses)

    # --- leases ------------------------------------------------------------------------------

    async def grant(self, ttl_s: int) -> int:
        """A new lease of ``ttl_s`` seconds: its id."""
        doc = await self._post("/v3/lease/grant", {"TTL": str(ttl_s)})
        return int(doc["ID"])

    async def keepalive_once(self, lease: int) -> int:
        """Renew the lease: its TTL now, 0 when it has expired or was revoked."""
        doc = await self._post("/v3/lease/keepalive", {"ID": str(lease)})
        return int(doc.get("result", {}).get("TTL", 0))

    async def revoke(self, lease: int) -> None:
        """End the lease and delete its keys (an unknown lease is not an error)."""
        try:
            await self._post("/v3/lease/revoke", {"ID": str(lease)})
        except EtcdError as exc:
            if exc.grpc_code != GRPC_NOT_FOUND:
                raise

    async def time_to_live(self, lease: int) -> int:
        """Seconds the lease has left; -1 when it does not exist."""
        doc = await self._post("/v3/lease/timetolive", {"ID": str(lease)})
        return int(doc.get("TTL", -1))

    # --- watches -----------------------------------------------------------------------------

    async def watch(
        self, key: str | bytes, *, prefix: bool = False, start_revision: int = 0
    ) -> AsyncIterator[list[WatchEvent]]:
        """The changes of the key (or prefix) from ``start_revision`` on, a list per revision
        batch, until the caller stops iterating. Raises :class:`WatchCompactedError` when
        the start revision is gone, :class:`EtcdUnavailableError` when the stream breaks
        (the caller resumes from the last revision it saw + 1)."""
        k = _key(key)
        req = _key_range(k, prefix)
        if start_revision:
            req["start_revision"] = str(start_revision)
        base = self.endpoints[0]
        try:
            async with self._http.stream(
                "POST",
                base + "/v3/watch",
                json={"create_request": req},
                timeout=httpx.Timeout(self.timeout_s, read=None),
            ) as r:
                if r.status_code != 200:
                    self._answer("/v3/watch", r.status_code, await r.aread())
                async for line in r.aiter_lines():
                    if not line.strip():
                        continue
                    doc = json.loads(line)
                    if "error" in doc:
                        self._answer("/v3/watch", 500, line.encode())
                    res = doc.get("result", {})
                    if res.get("canceled"):
                        compact = int(res.get("compact_revision", 0))
                        if compact:
                            raise WatchCompactedError(
                                f"watch of {k!r} from revision {start_revision}: compacted up to "
                                f"{compact}",
                                compact,
                            )
                        raise EtcdError(f"etcd cancelled the watch of {k!r}: {res}")
                    events = [
                        WatchEvent(e.get("type", "PUT"), KeyValue.of(e.get("kv", {})))
                        for e in res.get("events", ())
                    ]
                    if events:
                        yield events
        except httpx.TransportError as exc:
            raise EtcdUnavailableError(
                f"the watch of {k!r} at {base} broke: {exc!r}", GRPC_UNAVAILABLE
            ) from exc

    # --- elections ---------------------------------------------------------------------------

    async def campaign(
        self, name: str | bytes, lease: int, value: bytes, *, timeout_s: float
    ) -> LeaderKey:
        """Wait (up to ``timeout_s``) to be the leader of election ``name``, holding ``lease``."""
        doc = await self._post(
            "/v3/election/campaign",
            {"name": _b64(_key(name)), "lease": str(lease), "value": _b64(value)},
            timeout_s=timeout_s,
        )
        d = doc["leader"]
        return LeaderKey(_unb64(d["name"]), _unb64(d["key"]), int(d["rev"]), int(d["lease"]))

    async def leader(self, name: str | bytes) -> KeyValue | None:
        """The current leader's key and value, None when nobody leads."""
        try:
            doc = await self._post("/v3/election/leader", {"name": _b64(_key(name))})
        except EtcdError as exc:
            if "no leader" in str(exc):
                return None
            raise
        return KeyValue.of(doc["kv"])

    async def resign(self, leader: LeaderKey) -> None:
        await self._post("/v3/election/resign", {"leader": leader.to_json()})


@dataclass
class Lease:
    """A lease kept alive in the background: renewed every third of its TTL.

    Two ways it can end, told apart because they call for different things:

    - ``lost`` is set once etcd *said* the lease is gone (a renewal answered with no TTL: it
      expired or was revoked): the keys on it are gone, the others have seen this holder
      leave, and the holder must stop acting on them.
    - ``stale`` is set while the lease is past its TTL by this process's clock *and etcd has
      not answered* a renewal since: whether it expired is unknown. If etcd itself was down
      (killed and restarted, or without a quorum), it has not: a new raft leader gives every
      lease a full TTL again, so nobody has seen this holder leave, and nothing could be
      decided without it meanwhile. If only this holder was cut off from etcd, or etcd's
      only member was paused (its leases expire as it resumes), it has, and etcd says so
      (``lost``) once it answers.
      The renewals go on, every ``STALE_RETRY_S`` at most; ``stale`` is cleared when one is
      answered with a TTL.

    Kafka's brokers and Redpanda's nodes do not give up their leaderships because the
    metadata quorum is out of reach either: what is acknowledged stays safe through the
    replication itself (see :mod:`tidewire.cluster.node`).
    """

    client: EtcdClient
    ttl_s: int
    id: int = 0
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    stale: asyncio.Event = field(default_factory=asyncio.Event)
    clock: Callable[[], float] = time.monotonic
    _task: asyncio.Task[None] | None = None

    async def start(self) -> int:
        self.id = await self.client.grant(self.ttl_s)
        self._task = asyncio.create_task(self._keep(), name=f"etcd lease {self.id}")
        return self.id

    async def _keep(self) -> None:
        expires = self.clock() + self.ttl_s
        while True:
            pause = self.ttl_s / 3
            if self.stale.is_set():
                pause = min(pause, STALE_RETRY_S)  # learn soon that etcd is back
            await asyncio.sleep(pause)
            try:
                ttl = await self.client.keepalive_once(self.id)
            except EtcdError as exc:
                self.client.stats.keepalive_failures += 1
                if exc.grpc_code == GRPC_NOT_FOUND:
                    ttl = 0  # etcd answered: no such lease (any more)
                elif self.clock() < expires:
                    log.warning("etcd lease %d not renewed (will retry): %s", self.id, exc)
                    continue
                else:
                    if not self.stale.is_set():
                        log.warning(
                            "etcd lease %d is past its TTL of %d s and etcd does not answer: "
                            "renewing it again until etcd says whether it is alive (%s)",
                            self.id,
                            self.ttl_s,
                            exc,
                        )
                        self.stale.set()
                        self.client.stats.lease_stale_periods += 1
                    continue
            if ttl <= 0:
                log.warning("etcd lease %d lost", self.id)
                self.stale.clear()
                self.lost.set()
                return
            if self.stale.is_set():
                log.warning(
                    "etcd lease %d renewed again: etcd answers, the lease was kept", self.id
                )
                self.stale.clear()
            expires = self.clock() + ttl

    async def close(self, *, revoke: bool = True) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if revoke and self.id and not self.lost.is_set():
            with contextlib.suppress(EtcdError):
                await self.client.revoke(self.id)
