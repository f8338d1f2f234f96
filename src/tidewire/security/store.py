"""Principals, API keys, ACLs and quotas, kept in the broker's own log (``__security``).

Every change is one record appended to the internal topic and fsynced before it is
acknowledged; at start :meth:`SecurityStore.load` replays the log, so the state is what the
log says and recovers like any other log. The last record for an entity wins:

- key ``principal/<name>``: a :class:`Principal` (no value: deleted);
- key ``key/<id>``: a :class:`KeyRecord` (revocation writes it again, revoked);
- key ``acl/<principal>/<type>/<pattern type>/<pattern>/<operation>/<effect>``: an
  :class:`Acl` (no value: removed);
- key ``quota/<principal>``: a :class:`QuotaRecord` (no value: back to the defaults).

Changes take effect at once, everywhere: the gate asks the store on every request, so a
revoked key or a removed ACL refuses an open connection's next request.

In a cluster ``__security`` is a replicated partition (:mod:`tidewire.cluster.security`):
changes are written on its leader only and acknowledged once every in-sync replica holds
them (:class:`SecurityReplication`); every other node applies the records as it copies them
(:meth:`SecurityStore.replica_appended`) and replays its log again when it is cut
(:meth:`SecurityStore.reload`), so a key made on one node authenticates on all of them.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import msgspec

from tidewire.errors import (
    AuthenticationFailedError,
    InvalidRequestError,
    PrincipalExistsError,
    UnknownPrincipalError,
)
from tidewire.records import BatchBuilder, iter_batches, iter_records
from tidewire.security._logs import SECURITY_TOPIC, open_log, read_log, security_config
from tidewire.security.config import SecurityConfig
from tidewire.security.keys import hash_secret, new_key, parse_key, verify_secret
from tidewire.security.model import (
    BUILTIN_ROLES,
    Acl,
    KeyRecord,
    Principal,
    QuotaRecord,
    check_principal_name,
)
from tidewire.storage import LogManager, PartitionLog

__all__ = ["SCRAM_MECHANISMS", "SecurityReplication", "SecurityStore", "scram_keys"]

log = logging.getLogger("tidewire.security")

SCRAM_MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
#: Keys verified by their scrypt hash, remembered by a SHA-256 digest of the whole key, so a
#: client sending its key with every HTTP request pays scrypt once.
_VERIFIED_CACHE = 10_000
#: The file the first start with authentication on writes the first superuser's key to.
BOOTSTRAP_KEY_FILE = "bootstrap-admin.key"

_json = msgspec.json.Encoder()
#: The file a cluster's node keeps each replica's topic incarnation id in.
_TOPIC_ID_FILE = "topic-id"

#: The threads that compute scrypt and PBKDF2: two at most, because scrypt takes 16 MiB per
#: computation (kept by the allocator afterwards) and the event loop's default executor has
#: up to 32 threads; the failed-login limit bounds how many wait their turn.
_HASHING = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tidewire-hash")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def scram_keys(
    mechanism: str, secret: str, iterations: int, salt: bytes | None = None
) -> tuple[str, int, str, str]:
    """SCRAM credentials of ``secret`` (RFC 5802): ``(salt, iterations, StoredKey,
    ServerKey)``, bytes in base64."""
    h = SCRAM_MECHANISMS[mechanism]
    salt = secrets.token_bytes(16) if salt is None else salt
    salted = hashlib.pbkdf2_hmac(h, secret.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", h).digest()
    stored = hashlib.new(h, client_key).digest()
    server = hmac.new(salted, b"Server Key", h).digest()
    return _b64(salt), iterations, _b64(stored), _b64(server)


def _now_ms() -> int:
    return int(time.time() * 1000)


class SecurityReplication(Protocol):
    """How a store of a cluster's node writes: on the leader of ``__security`` only, and
    acknowledged once every in-sync replica holds the change."""

    async def leader_log(self) -> PartitionLog:
        """The local log of ``__security`` once this node leads it (it is created in the
        cluster first when it does not exist yet).

        Raises:
            NotLeaderError: another node leads it (named in the error).
            NotEnoughReplicasError: fewer in-sync replicas than ``min_insync_replicas``.
            RequestTimedOutError: the cluster did not answer in time.
        """
        ...

    async def wait_replicated(self, end: int) -> None:
        """Until every in-sync replica holds ``__security`` below ``end``.

        Raises:
            NotLeaderError, RequestTimedOutError.
        """
        ...


class SecurityStore:
    """The security state of one broker, backed by ``__security``.

    Args:
        logs: the broker's log manager (open).
        config: the security settings.
        clock_ms: wall clock in ms (tests replace it).
    """

    def __init__(
        self,
        logs: LogManager,
        config: SecurityConfig,
        clock_ms: Callable[[], int] = _now_ms,
    ) -> None:
        self._logs = logs
        self.config = config
        self._clock = clock_ms
        self.principals: dict[str, Principal] = {}
        self.keys: dict[str, KeyRecord] = {}
        self.acls: set[Acl] = set()
        self.quotas: dict[str, QuotaRecord] = {}
        self._verified: OrderedDict[bytes, str] = OrderedDict()
        self._lock = asyncio.Lock()
        self._plog: PartitionLog | None = None
        #: Incremented by every change: the authorizer's caches compare it.
        self.version = 0
        #: The key of SCRAM's stand-in credentials for unknown key ids, kept in the log (see
        #: :meth:`ensure_secret`) so that an unknown id looks the same across restarts.
        self.stand_in_secret = secrets.token_bytes(32)
        self._secret_stored = False
        #: Set by a node of a cluster: changes go through the leader of ``__security``.
        self._replication: SecurityReplication | None = None

    def replicate(self, replication: SecurityReplication | None) -> None:
        """Write through ``replication`` from now on (None: a single node's own log)."""
        self._replication = replication

    def now_ms(self) -> int:
        """The store's clock: the time that key expiry is judged by."""
        return self._clock()

    # --- loading ------------------------------------------------------------------------------

    def load(self) -> None:
        """Replay ``__security`` when it exists (it is created by the first change)."""
        plog = self._logs.logs.get((SECURITY_TOPIC, 0))
        if plog is None:
            return
        self._plog = open_log(self._logs, SECURITY_TOPIC, security_config())
        bad = 0
        for rec in read_log(plog):
            if rec.key is None or not self._apply(rec.key.decode(errors="replace"), rec.value):
                bad += 1
        if bad:
            log.warning("%s: %d undecodable record(s) skipped", SECURITY_TOPIC, bad)
        log.info(
            "security: %d principal(s), %d key(s), %d ACL(s) loaded",
            len(self.principals),
            len(self.keys),
            len(self.acls),
        )

    def reload(self) -> None:
        """Forget the state and replay the local ``__security`` again: its log was cut (a
        replica that diverged from its leader), replaced or deleted, so what was applied
        from the records above the cut no longer holds."""
        self.principals = {}
        self.keys = {}
        self.acls = set()
        self.quotas = {}
        self._verified.clear()
        self._secret_stored = False
        self._plog = None
        self.version += 1
        self.load()

    def replica_appended(self, data: bytes | memoryview) -> None:
        """Records copied from the leader of ``__security`` (whole batches, as a follower
        stores them): apply them as the leader did. A change is seen here as soon as it is
        copied; a cut that removes it afterwards replays the log (:meth:`reload`)."""
        view = memoryview(data)
        bad = 0
        for pos, h in iter_batches(view, verify=False):
            for rec in iter_records(view[pos : pos + h.size]):
                if rec.key is None or not self._apply(rec.key.decode(errors="replace"), rec.value):
                    bad += 1
        if bad:
            log.warning("%s: %d undecodable copied record(s) skipped", SECURITY_TOPIC, bad)
        self._verified.clear()

    def _apply(self, key: str, value: bytes | None) -> bool:
        kind, _, ident = key.partition("/")
        try:
            if kind == "principal":
                if value is None:
                    self.principals.pop(ident, None)
                else:
                    self.principals[ident] = msgspec.json.decode(value, type=Principal)
            elif kind == "key":
                if value is None:
                    self.keys.pop(ident, None)
                else:
                    self.keys[ident] = msgspec.json.decode(value, type=KeyRecord)
            elif kind == "acl":
                if value is None:
                    self.acls = {a for a in self.acls if _acl_key(a) != key}
                else:
                    self.acls.add(msgspec.json.decode(value, type=Acl))
            elif kind == "secret":
                if value is not None and len(value) == 32:
                    self.stand_in_secret = bytes(value)
                    self._secret_stored = True
            elif kind == "quota":
                if value is None:
                    self.quotas.pop(ident, None)
                else:
                    self.quotas[ident] = msgspec.json.decode(value, type=QuotaRecord)
            else:
                return False
        except (msgspec.DecodeError, msgspec.ValidationError):
            return False
        self.version += 1
        return True

    async def _write(self, entries: Iterable[tuple[str, bytes | None]]) -> None:
        """Append ``entries`` (key, value) as one batch, fsynced, then apply them (in a
        cluster: on the leader of ``__security``, answered once its in-sync replicas hold
        them)."""
        items = list(entries)
        replication = self._replication
        if replication is not None:
            # Even a change that changes nothing: made on this node, it makes __security
            # exist in the cluster (with this node's state), or is answered NotLeader.
            plog = await replication.leader_log()
        if not items:
            return
        if replication is None:
            if self._plog is None:
                self._plog = open_log(self._logs, SECURITY_TOPIC, security_config())
            plog = self._plog
        builder = BatchBuilder()
        now = self._clock()
        for key, value in items:
            builder.append(value, key=key.encode(), timestamp_ms=now)
        (info,) = await plog.append_many_async([builder.build()], durable=True)
        # Applied at once, as the followers apply what they copy: a change stored here but
        # not acknowledged (replicas too slow) is in force here as it is on them.
        for key, value in items:
            self._apply(key, value)
        self._verified.clear()
        if replication is not None:
            await replication.wait_replicated(info.last_offset + 1)

    async def ensure_secret(self) -> None:
        """Store :attr:`stand_in_secret` in the log if it is not there yet."""
        if not self._secret_stored:
            await self._write([("secret/stand-in", self.stand_in_secret)])

    # --- principals ---------------------------------------------------------------------------

    def principal(self, name: str) -> Principal:
        """Raises: UnknownPrincipalError."""
        p = self.principals.get(name)
        if p is None:
            raise UnknownPrincipalError(f"no principal named {name!r}")
        return p

    async def create_principal(
        self,
        name: str,
        *,
        kind: str = "user",
        roles: Iterable[str] = (),
        description: str = "",
    ) -> Principal:
        """Raises: PrincipalExistsError, InvalidRequestError (a bad name, kind or role)."""
        check_principal_name(name)
        if kind not in ("user", "service"):
            raise InvalidRequestError(f"principal kind {kind!r} must be user or service")
        roles = self._check_roles(roles)
        _check_description(description)
        async with self._lock:
            if name in self.principals:
                raise PrincipalExistsError(f"principal {name!r} exists already")
            p = Principal(
                name=name,
                kind=kind,
                roles=roles,
                created_ms=self._clock(),
                description=description,
            )
            await self._write([(f"principal/{name}", _json.encode(p))])
        return p

    def known_roles(self) -> set[str]:
        """The built-in roles and those an ACL names (``role:NAME``)."""
        named = {a.principal[5:] for a in self.acls if a.principal.startswith("role:")}
        return set(BUILTIN_ROLES) | named

    def _check_roles(self, roles: Iterable[str]) -> tuple[str, ...]:
        out = tuple(dict.fromkeys(r.strip() for r in roles if r.strip()))
        known = self.known_roles()
        for r in out:
            check_principal_name(r)
            if r not in known:
                raise InvalidRequestError(
                    f"unknown role {r!r}: the built-in roles are "
                    f"{', '.join(sorted(BUILTIN_ROLES))}; a role of your own exists once an "
                    f"ACL names it (principal 'role:{r}')"
                )
        return out

    async def set_roles(self, name: str, roles: Iterable[str]) -> Principal:
        """Raises: UnknownPrincipalError, InvalidRequestError."""
        return await self.alter_principal(name, roles=roles)

    async def alter_principal(
        self, name: str, *, roles: Iterable[str] | None = None, description: str | None = None
    ) -> Principal:
        """Replace the roles and/or the description of a principal (None: leave as is).

        Raises: UnknownPrincipalError, InvalidRequestError (an unknown role, a description
        over 256 characters)."""
        checked = None if roles is None else self._check_roles(roles)
        if description is not None:
            _check_description(description)
        async with self._lock:
            p = self.principal(name)
            if checked is not None:
                p = msgspec.structs.replace(p, roles=checked)
            if description is not None:
                p = msgspec.structs.replace(p, description=description)
            await self._write([(f"principal/{name}", _json.encode(p))])
        return p

    async def delete_principal(self, name: str) -> None:
        """Delete a principal with its keys, ACLs and quota.

        Raises: UnknownPrincipalError."""
        async with self._lock:
            self.principal(name)
            entries: list[tuple[str, bytes | None]] = [(f"principal/{name}", None)]
            entries += [(f"key/{k.id}", None) for k in self.keys.values() if k.principal == name]
            entries += [(_acl_key(a), None) for a in self.acls if a.principal == name]
            if name in self.quotas:
                entries.append((f"quota/{name}", None))
            await self._write(entries)

    # --- keys ---------------------------------------------------------------------------------

    async def create_key(
        self, principal: str, *, expires_ms: int = 0, description: str = ""
    ) -> tuple[KeyRecord, str]:
        """A new key of ``principal``: its record and the whole key (shown once, never
        stored).

        Raises: UnknownPrincipalError, InvalidRequestError (an expiry in the past)."""
        self.principal(principal)
        _check_description(description)
        now = self._clock()
        if expires_ms and expires_ms <= now:
            raise InvalidRequestError(f"expires_ms={expires_ms} is in the past (now {now})")
        key_id, secret, whole = new_key()
        iterations = self.config.scram_iterations

        def derive() -> tuple[str, dict[str, tuple[str, int, str, str]]]:
            return hash_secret(secret), {
                m: scram_keys(m, secret, iterations) for m in SCRAM_MECHANISMS
            }

        secret_hash, scram = await asyncio.get_running_loop().run_in_executor(_HASHING, derive)
        rec = KeyRecord(
            id=key_id,
            principal=principal,
            created_ms=now,
            expires_ms=expires_ms,
            description=description,
            secret_hash=secret_hash,
            scram=scram,
        )
        async with self._lock:
            self.principal(principal)  # deleted meanwhile?
            await self._write([(f"key/{key_id}", _json.encode(rec))])
        return rec, whole

    async def revoke_key(self, key_id: str) -> KeyRecord:
        """Raises: UnknownPrincipalError (no such key)."""
        async with self._lock:
            rec = self.keys.get(key_id)
            if rec is None:
                raise UnknownPrincipalError(f"no API key with id {key_id!r}")
            if not rec.revoked_ms:
                rec = msgspec.structs.replace(rec, revoked_ms=self._clock())
                await self._write([(f"key/{key_id}", _json.encode(rec))])
        return rec

    def key_principal(self, key_id: str) -> Principal | None:
        """The principal of a usable (not revoked, not expired) key, or None."""
        rec = self.keys.get(key_id)
        if rec is None or not rec.usable(self._clock()):
            return None
        return self.principals.get(rec.principal)

    def scram_credential(
        self, key_id: str, mechanism: str
    ) -> tuple[bytes, int, bytes, bytes] | None:
        """``(salt, iterations, StoredKey, ServerKey)`` of a usable key for ``mechanism``."""
        rec = self.keys.get(key_id)
        if rec is None or not rec.usable(self._clock()) or rec.principal not in self.principals:
            return None
        cred = rec.scram.get(mechanism)
        if cred is None:
            return None
        salt, iterations, stored, server = cred
        return (
            base64.b64decode(salt),
            iterations,
            base64.b64decode(stored),
            base64.b64decode(server),
        )

    async def verify_key(self, key: str) -> Principal:
        """The principal of a whole API key (PLAIN, ``Authorization: Bearer``).

        Raises:
            AuthenticationFailedError: malformed, unknown, wrong, expired or revoked; the
                message names the key id at most.
        """
        key_id, secret = parse_key(key)
        rec = self.keys.get(key_id)
        digest = hashlib.sha256(key.encode()).digest()
        if rec is None:
            raise AuthenticationFailedError(f"unknown API key id {key_id}")
        if self._verified.get(digest) != key_id:
            ok = await asyncio.get_running_loop().run_in_executor(
                _HASHING, verify_secret, secret, rec.secret_hash
            )
            if not ok:
                raise AuthenticationFailedError(f"wrong secret for API key id {key_id}")
            self._verified[digest] = key_id
            if len(self._verified) > _VERIFIED_CACHE:
                self._verified.popitem(last=False)
        now = self._clock()
        rec = self.keys.get(key_id)
        if rec is None or not rec.usable(now):
            state = "revoked" if rec is None else rec.state(now)
            raise AuthenticationFailedError(f"API key id {key_id} is {state}")
        p = self.principals.get(rec.principal)
        if p is None:
            raise AuthenticationFailedError(f"API key id {key_id}: its principal was deleted")
        return p

    # --- ACLs and quotas ----------------------------------------------------------------------

    async def add_acls(self, acls: Iterable[Acl]) -> list[Acl]:
        """Add ACL entries (checked; those present already are left as they are)."""
        new = [a.check() for a in acls]
        async with self._lock:
            todo = [a for a in dict.fromkeys(new) if a not in self.acls]
            await self._write([(_acl_key(a), _json.encode(a)) for a in todo])
        return todo

    async def remove_acls(self, acls: Iterable[Acl]) -> list[Acl]:
        """Remove ACL entries; returns those that were present."""
        async with self._lock:
            gone = [a for a in dict.fromkeys(acls) if a in self.acls]
            await self._write([(_acl_key(a), None) for a in gone])
        return gone

    async def set_quota(self, rec: QuotaRecord) -> None:
        """Raises: UnknownPrincipalError, InvalidRequestError (a value below -1)."""
        for name in ("produce_bytes_per_s", "fetch_bytes_per_s", "requests_per_s"):
            if getattr(rec, name) < -1:
                raise InvalidRequestError(f"{name}={getattr(rec, name)} must be >= -1")
        async with self._lock:
            self.principal(rec.principal)
            await self._write([(f"quota/{rec.principal}", _json.encode(rec))])

    async def clear_quota(self, principal: str) -> None:
        async with self._lock:
            if principal in self.quotas:
                await self._write([(f"quota/{principal}", None)])

    # --- the first start ----------------------------------------------------------------------

    def _replica_of_a_cluster(self) -> bool:
        """Whether the local ``__security`` is a replica of a cluster's (its directory holds
        the cluster's incarnation id, ``tidewire.cluster.node.TOPIC_ID_FILE``): it is then
        written by its leader only, never by this node on its own at start, which would make
        it differ from the leader's log at offsets the leader also uses."""
        plog = self._logs.logs.get((SECURITY_TOPIC, 0))
        return plog is not None and self._logs.fs.exists(f"{plog.directory}/{_TOPIC_ID_FILE}")

    async def bootstrap(self, data_dir: Path) -> Path | None:
        """With authentication on and no principal at all: create the first superuser named
        in ``superusers`` (``admin`` when none is), give it the admin role and a key, and
        write the key to ``DATA_DIR/bootstrap-admin.key`` (mode 0600) for the operator to
        take. Returns the file's path when it wrote one."""
        if not self.config.authentication or self._replica_of_a_cluster():
            return None
        await self.ensure_secret()
        if self.principals:
            return None
        names = sorted(self.config.superuser_names) or ["admin"]
        name = names[0]
        await self.create_principal(
            name, kind="user", roles=("admin",), description="created at the first start"
        )
        _, whole = await self.create_key(name, description="bootstrap key")
        path = data_dir / BOOTSTRAP_KEY_FILE
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(whole + "\n")
        log.warning(
            "authentication is on and no principal existed: created %r (role admin); its "
            "API key is in %s (readable by this user only): take it, then delete the file",
            name,
            path,
        )
        return path


#: Characters a principal's or a key's description may have.
MAX_DESCRIPTION_CHARS = 256


def _check_description(text: str) -> None:
    if len(text) > MAX_DESCRIPTION_CHARS:
        raise InvalidRequestError(
            f"a description of {len(text):,} characters exceeds {MAX_DESCRIPTION_CHARS}"
        )


def _acl_key(a: Acl) -> str:
    return (
        f"acl/{a.principal}/{a.resource_type}/{a.pattern_type}/{a.pattern}/{a.operation}/{a.effect}"
    )


def role_names() -> list[str]:
    """The built-in roles."""
    return sorted(BUILTIN_ROLES)
