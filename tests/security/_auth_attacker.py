"""Attackers guessing API keys, in a process of their own (so their work does not share the
test's event loop, nor the broker's).

Run as ``python -m tests.security._auth_attacker SETTINGS_JSON OUTPUT_FILE``; writes one JSON
object with what the broker answered to OUTPUT_FILE (a file, not stdout: with thousands of
keys it is larger than a pipe holds). Settings:

- ``addr``: the broker's ``host:port``; ``http``: its HTTP API's ``host:port`` (or null);
- ``attempts``: wrong keys in all; ``connections``: how many connections share them;
- ``modes``: the kinds of attacker, given to the connections in turn: ``scram-unknown``
  (SCRAM-SHA-256 with key ids that do not exist), ``scram-wrong`` (SCRAM with the id of a
  real key and a wrong secret), ``plain-wrong`` (PLAIN with a real key id and a wrong secret:
  the broker must verify it with scrypt), ``bearer-wrong`` (``Authorization: Bearer`` with a
  real key id and a wrong secret, over HTTP);
- ``key_id``: the real key id the ``-wrong`` modes guess secrets of;
- ``pipeline``: attempts each binary connection (PLAIN) or HTTP client sends at once
  (default 1: one after another).

Every attempt is a new wrong key; a connection keeps going after a refusal, as an attacker
would. The output counts the answers by error class (``AuthenticationFailedError``,
``TooManyAuthFailuresError``, ``http-401``, ``http-429``, ...), per mode, and the wrong keys
tried (so the test can look for them in the broker's log).
"""

from __future__ import annotations

import asyncio
import collections
import json
import secrets
import sys
import time
from typing import Any

import httpx

from tidewire.client._transport import Transport
from tidewire.errors import TidewireError
from tidewire.protocol.messages import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
)
from tidewire.security.keys import KEY_PREFIX
from tidewire.security.scram import ScramClient

MODES = ("scram-unknown", "scram-wrong", "plain-wrong", "bearer-wrong")


def wrong_key(key_id: str | None) -> str:
    """A well-formed key that is not a real one: a random id, or ``key_id`` with a random
    secret."""
    kid = key_id or secrets.token_hex(6)
    return f"{KEY_PREFIX}{kid}_{secrets.token_urlsafe(32)[:43]}"


async def _scram(t: Transport, key: str) -> None:
    _, kid, secret = key.split("_", 2)
    await t.request(SaslHandshakeRequest(mechanism="SCRAM-SHA-256"))
    scram = ScramClient("SCRAM-SHA-256", kid, secret)
    r = await t.request(SaslAuthenticateRequest(auth_bytes=scram.first()))
    assert r is not None
    assert isinstance(r.body, SaslAuthenticateResponse)
    final = scram.final(r.body.auth_bytes)
    await t.request(SaslAuthenticateRequest(auth_bytes=final))


async def _plain(t: Transport, key: str) -> None:
    # Both frames are written at once (no await between the two sends' writes when
    # pipelined): the handshake, then the key.
    hs = asyncio.ensure_future(t.request(SaslHandshakeRequest(mechanism="PLAIN")))
    auth = asyncio.ensure_future(
        t.request(SaslAuthenticateRequest(auth_bytes=b"\0\0" + key.encode()))
    )
    try:
        await hs
    finally:
        await auth


async def attack(settings: dict[str, Any]) -> dict[str, Any]:
    modes = settings.get("modes") or list(MODES)
    n, conns = int(settings["attempts"]), int(settings["connections"])
    pipeline = int(settings.get("pipeline", 1))
    key_id = settings.get("key_id")
    counts: dict[str, collections.Counter[str]] = {m: collections.Counter() for m in modes}
    keys: list[str] = []
    share = [n // conns + (1 if i < n % conns else 0) for i in range(conns)]

    def outcome(mode: str, exc: BaseException | None) -> None:
        counts[mode][type(exc).__name__ if exc is not None else "accepted"] += 1

    async def binary(mode: str, count: int) -> None:
        t = Transport(settings["addr"], request_timeout_s=60)
        try:
            left = count
            while left > 0:
                batch = min(pipeline, left)
                left -= batch
                tries = []
                for _ in range(batch):
                    key = wrong_key(None if mode == "scram-unknown" else key_id)
                    keys.append(key)
                    tries.append(_scram(t, key) if mode.startswith("scram") else _plain(t, key))
                for r in await asyncio.gather(*tries, return_exceptions=True):
                    if isinstance(r, BaseException) and not isinstance(r, TidewireError):
                        raise r
                    outcome(mode, r if isinstance(r, BaseException) else None)
        finally:
            await t.close()

    async def bearer(count: int) -> None:
        limits = httpx.Limits(max_connections=pipeline, max_keepalive_connections=pipeline)
        async with httpx.AsyncClient(
            base_url=f"http://{settings['http']}", limits=limits, timeout=60
        ) as client:
            left = count

            async def one() -> None:
                key = wrong_key(key_id)
                keys.append(key)
                r = await client.get("/v1/topics", headers={"authorization": f"Bearer {key}"})
                counts["bearer-wrong"][f"http-{r.status_code}"] += 1

            while left > 0:
                batch = min(pipeline, left)
                left -= batch
                await asyncio.gather(*(one() for _ in range(batch)))

    start = time.monotonic()
    jobs = []
    for i, count in enumerate(share):
        mode = modes[i % len(modes)]
        jobs.append(bearer(count) if mode == "bearer-wrong" else binary(mode, count))
    await asyncio.gather(*jobs)
    return {
        "seconds": time.monotonic() - start,
        "counts": {m: dict(c) for m, c in counts.items()},
        "attempts": sum(sum(c.values()) for c in counts.values()),
        "keys": keys,
    }


def main(argv: list[str]) -> None:
    settings, output = argv
    report = asyncio.run(attack(json.loads(settings)))
    with open(output, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(sys.argv[1:])
