"""The one gate: every request from every interface passes here before its handler runs.

A listener keeps a :class:`Session` per connection (binary protocol, WebSocket) or per
request (HTTP): who is on the other end, from where, over what. :meth:`Gate.check` takes the
session and what the API or route declared it needs (``server/needs.py`` for the binary
protocol, ``server/http/auth.py`` for HTTP) and either returns or raises:

- :class:`~tidewire.errors.AuthenticationFailedError` when authentication is on and the
  session has no principal, or its key was revoked or expired since it authenticated (so a
  revocation refuses an open connection's next request);
- :class:`~tidewire.errors.AuthorizationFailedError` when a permission is missing; nothing
  has run, so nothing changed. Each denial is audited.

With authentication off every request is anonymous and allowed, except reading the
broker's private internal topics (``__security``, ``__audit``), which no client may read.

Authentication itself (SCRAM and PLAIN over the binary protocol, ``Authorization: Bearer``
over HTTP, client certificates) goes through :meth:`Gate.authenticate_key` and
:meth:`Gate.sasl`, rate-limited per source address and per principal, each failure audited.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tidewire.broker.offsets import QUEUE_DEFINITIONS_TOPIC, QUEUE_TOPIC_PREFIX
from tidewire.cluster import cluster_node
from tidewire.errors import (
    AuthenticationFailedError,
    AuthorizationFailedError,
    TidewireError,
    TooManyAuthFailuresError,
    UnsupportedSaslMechanismError,
)
from tidewire.protocol.messages import ApiKey
from tidewire.security._logs import PRIVATE_TOPICS, is_audit_topic
from tidewire.security.audit import Actor, AuditEvent, current_actor
from tidewire.security.authorizer import Authorizer
from tidewire.security.config import SecurityConfig
from tidewire.security.keys import parse_key, redact
from tidewire.security.model import Operation, Principal, ResourceType
from tidewire.security.quotas import QuotaLimits, Quotas
from tidewire.security.ratelimit import FailureLimiter
from tidewire.security.scram import ScramCredential, ScramServer
from tidewire.security.store import SecurityStore
from tidewire.server.needs import AUTHENTICATED, PUBLIC, Need, Requirement, StreamNeeds

if TYPE_CHECKING:
    from tidewire.broker import Broker

__all__ = [
    "CURRENT_SESSION",
    "SESSION_APIS",
    "Gate",
    "Session",
    "gate_for",
    "names_allowed",
    "source_of",
]

log = logging.getLogger("tidewire.security")

#: The session of the request being handled (set by the listener around each handler), for
#: handlers that show only what the principal may see.
CURRENT_SESSION: contextvars.ContextVar[Session | None] = contextvars.ContextVar(
    "tidewire_session", default=None
)

#: APIs the listener answers from the connection's session, not through a handler: the
#: SASL exchange and WHOAMI.
SESSION_APIS = frozenset({ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE, ApiKey.WHOAMI})

PLAIN = "PLAIN"
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(slots=True)
class Session:
    """Who is on the other end of a connection (or of one HTTP request).

    Attributes:
        source: the client's ``host:port``.
        interface: ``binary``, ``http``, ``websocket``, ``sse``, ``msgbus``, ``ipubsub``,
            ``kafka``.
        tls: whether the connection is TLS.
        principal_name: who it authenticated as ("": nobody yet).
        key_id: the API key it authenticated with ("" for a certificate).
        mechanism: how: ``SCRAM-SHA-256``, ``SCRAM-SHA-512``, ``PLAIN``, ``bearer``,
            ``certificate``.
        cert_principal: the principal named by a verified client certificate, if any.
    """

    source: str
    interface: str
    tls: bool = False
    principal_name: str = ""
    key_id: str = ""
    mechanism: str = ""
    cert_principal: str | None = None
    #: The SASL exchange under way (binary protocol).
    sasl: Any = None
    sasl_mechanism: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    #: The audit actor of its requests, made by :meth:`Gate.enter` for its principal.
    actor: Actor | None = None

    @property
    def authenticated(self) -> bool:
        return bool(self.principal_name)


def source_of(peername: Any) -> str:
    """``host:port`` of a socket's peer name."""
    if isinstance(peername, tuple) and len(peername) >= 2:
        return f"{peername[0]}:{peername[1]}"
    return str(peername or "unknown")


def _host(source: str) -> str:
    return source.rpartition(":")[0] or source


#: The broker's own topics reached only through their APIs (beside :data:`PRIVATE_TOPICS`).
_API_TOPICS = frozenset({QUEUE_DEFINITIONS_TOPIC, "__streams"})


@functools.lru_cache(maxsize=4096)
def is_private_topic(name: str) -> bool:
    """Whether no client may touch topic ``name`` as a topic, even with authentication off:
    the security state, the audit log, and the queues' logs and definitions (reached only
    through the queue APIs, under the queue permissions).

    Remembered for the last 4,096 names asked about (the answer depends on the name alone):
    the gate asks for every topic of every request."""
    return (
        name in PRIVATE_TOPICS
        or is_audit_topic(name)
        or name in _API_TOPICS
        or name.startswith(QUEUE_TOPIC_PREFIX)
    )


class Gate:
    """Authentication and authorization for one broker (see the module docstring)."""

    def __init__(self, broker: Broker, config: SecurityConfig) -> None:
        self.broker = broker
        self.config = config
        self._authorizer = Authorizer(broker.security)
        self.limiter = FailureLimiter(config.auth_failures_per_minute)
        self.quotas = Quotas(
            QuotaLimits(
                produce_bytes_per_s=config.quota_produce_bytes_per_s,
                fetch_bytes_per_s=config.quota_fetch_bytes_per_s,
                requests_per_s=config.quota_requests_per_s,
            )
        )
        self._quota_version = -1
        self._overridden: set[str] = set()
        #: Counters for metrics: requests refused by ACLs, authentications that succeeded,
        #: failed, and were refused by the failure limit.
        self.denied = 0
        self.auth_ok = 0
        self.auth_failures = 0
        self.auth_rate_limited = 0

    @property
    def store(self) -> SecurityStore:
        """The broker's security state (made anew by each start)."""
        return self.broker.security

    @property
    def authorizer(self) -> Authorizer:
        if self._authorizer.store is not self.broker.security:
            self._authorizer = Authorizer(self.broker.security)
        return self._authorizer

    @property
    def enabled(self) -> bool:
        """Whether authentication (and so authorization) is on."""
        return self.config.authentication

    # --- who ----------------------------------------------------------------------------------

    def principal(self, session: Session) -> Principal | None:
        """The session's principal as the store says now (None: anonymous).

        Raises:
            AuthenticationFailedError: authentication is on and the session has none, or its
                key was revoked or expired, or its principal deleted, since it authenticated.
        """
        if not session.principal_name and session.cert_principal:
            session.principal_name = session.cert_principal
            session.mechanism = "certificate"
        if not session.principal_name:
            if self.enabled:
                raise AuthenticationFailedError(
                    "authentication required: authenticate with an API key (SASL SCRAM or "
                    "PLAIN, or Authorization: Bearer over HTTP)"
                )
            return None
        if session.key_id:
            p = self.store.key_principal(session.key_id)
            if p is None:
                rec = self.store.keys.get(session.key_id)
                state = "revoked" if rec is None else rec.state(int(time.time() * 1000))
                if rec is not None and state == "active":
                    state = "without a principal"
                raise AuthenticationFailedError(
                    f"API key id {session.key_id} is {state}: authenticate again"
                )
            return p
        p = self.store.principals.get(session.principal_name)
        if p is None:  # a certificate's subject not registered: ACLs by name still apply
            return Principal(name=session.principal_name, kind="certificate")
        return p

    # --- what ---------------------------------------------------------------------------------

    def check(
        self, session: Session, action: str, requirement: Requirement | None, request: Any
    ) -> Principal | None:
        """Let the request through, or raise.

        Args:
            action: the API or route, for the audit log and errors.
            requirement: the API's or route's declaration (None: nothing declared, refused).
            request: what the requirement's function reads the resource names from.

        Raises:
            AuthenticationFailedError, AuthorizationFailedError.
        """
        if requirement is None:
            raise AuthorizationFailedError(f"{action} declares no permission, so no one may use it")
        if requirement is PUBLIC:
            return None
        principal = self.principal(session)
        if requirement is AUTHENTICATED:
            return principal
        assert callable(requirement)
        if isinstance(requirement, StreamNeeds) and (principal is None or not self.enabled):
            return principal  # no ACL applies and it names no private topic
        needs = requirement(request)
        for need in needs:
            if need.resource is ResourceType.TOPIC and is_private_topic(need.name):
                self._deny(
                    session, principal, action, need, f"{need.name} is private to the broker"
                )
        if principal is None or not self.enabled:  # authentication off: no ACL applies
            return principal
        for need in needs:
            if need.if_missing and self._topic_exists(need.name):
                continue
            if not need.applies_to(principal.name):  # one's own keys
                continue
            decision = self.authorizer.decide(principal, need.resource, need.name, need.operation)
            if not decision.allowed:
                self._deny(session, principal, action, need, decision.reason)
        return principal

    def can(
        self, session: Session | None, resource: ResourceType, name: str, op: Operation
    ) -> bool:
        """Whether the session may ``op`` the resource (for listings that show only what
        the principal may describe). Never raises."""
        if resource is ResourceType.TOPIC and is_private_topic(name):
            return False
        if session is None or not self.enabled:
            return True
        try:
            principal = self.principal(session)
        except TidewireError:
            return False
        if principal is None:
            return True
        return self.authorizer.decide(principal, resource, name, op).allowed

    def _topic_exists(self, name: str) -> bool:
        # In a cluster, whether the cluster has it: the node reached may hold no replica of
        # it and redirect or forward the request to its leader.
        node = cluster_node(self.broker)
        if node is not None:
            return name in node.cache.topics
        return name in self.broker.topics()

    def _deny(
        self, session: Session, principal: Principal | None, action: str, need: Need, reason: str
    ) -> None:
        self.denied += 1
        who = principal.name if principal is not None else "anonymous"
        self.audit(session, action, f"{need.resource}:{need.name}", "denied", reason)
        raise AuthorizationFailedError(
            f"{who} may not {need.operation} {need.resource}:{need.name}"
        )

    # --- authentication -----------------------------------------------------------------------

    def _check_not_blocked(
        self, session: Session, principal: str | None, *, begin: bool = False
    ) -> None:
        """Raise TooManyAuthFailuresError (audited) when the limit is reached; with
        ``begin``, an attempt let through counts as a failure until ``limiter.end``."""
        host = _host(session.source)
        wait = (
            self.limiter.begin(host, principal) if begin else self.limiter.blocked(host, principal)
        )
        if wait > 0:
            self.auth_rate_limited += 1
            self.audit(session, "authenticate", "", "denied", "rate limited", principal=principal)
            raise TooManyAuthFailuresError(
                f"too many failed authentications from {_host(session.source)}"
                + (f" or for {principal}" if principal else "")
                + f": retry in {wait:.0f} s"
            )

    def _failed(self, session: Session, principal: str | None, exc: TidewireError) -> None:
        self.auth_failures += 1
        self.limiter.failed(_host(session.source), principal)
        self.audit(session, "authenticate", "", "failed", redact(exc.message), principal=principal)

    def _succeeded(
        self, session: Session, principal: Principal, key_id: str, mechanism: str
    ) -> None:
        self.auth_ok += 1
        self.limiter.succeeded(_host(session.source), principal.name)
        session.principal_name = principal.name
        session.key_id = key_id
        session.mechanism = mechanism
        if mechanism != "bearer":  # HTTP authenticates every request: only failures
            self.audit(session, "authenticate", f"principal:{principal.name}", "ok", mechanism)

    async def authenticate_key(
        self, session: Session, key: str, mechanism: str = "bearer"
    ) -> Principal:
        """Authenticate ``session`` with a whole API key (PLAIN, ``Authorization: Bearer``).

        Raises:
            TooManyAuthFailuresError: this source failed too often lately.
            AuthenticationFailedError: a wrong, unknown, expired or revoked key.
        """
        key_id = ""
        try:
            key_id, _ = parse_key(key)
        except AuthenticationFailedError as exc:
            self._check_not_blocked(session, None)
            self._failed(session, None, exc)
            raise
        rec = self.store.keys.get(key_id)
        owner = rec.principal if rec is not None else None
        # Counted as a failure while scrypt runs: attempts sent at once cannot all pass.
        self._check_not_blocked(session, owner, begin=True)
        try:
            principal = await self.store.verify_key(key)
        except AuthenticationFailedError as exc:
            self._failed(session, owner, exc)
            raise
        finally:
            self.limiter.end(_host(session.source), owner)
        self._succeeded(session, principal, key_id, mechanism)
        return principal

    async def hold_back(self, exc: TidewireError) -> None:
        """Wait ``auth_failure_delay_ms`` before the answer to a failed or refused
        authentication goes out (Kafka's ``connection.failed.authentication.delay.ms``):
        a guesser waits that long per attempt on each connection, and the broker spends
        nothing meanwhile; the connection's other requests are not held."""
        if isinstance(exc, (AuthenticationFailedError, TooManyAuthFailuresError)):
            delay = self.config.auth_failure_delay_ms / 1000
            if delay > 0:
                await asyncio.sleep(delay)

    def mechanisms(self, session: Session) -> list[str]:
        """The SASL mechanisms ``session`` may use."""
        out = list(SCRAM_MECHANISMS)
        if session.tls or self.config.allow_plain_without_tls:
            out.append(PLAIN)
        return out

    def sasl_start(self, session: Session, mechanism: str) -> list[str]:
        """Choose the mechanism of the exchange that follows (SASL_HANDSHAKE).

        Raises:
            UnsupportedSaslMechanismError: not offered on this connection (PLAIN without TLS).
            TooManyAuthFailuresError: the source is over its failed-authentication limit: it
                is refused here, at the exchange's first request, at the least cost.
        """
        try:
            self._check_not_blocked(session, None)
        except TooManyAuthFailuresError as exc:
            # The SASL_AUTHENTICATE a client pipelines after it gets the same answer.
            session.sasl_mechanism, session.sasl = "", exc
            raise
        offered = self.mechanisms(session)
        if mechanism not in offered:
            why = (
                " (PLAIN sends the key itself: it needs TLS, or allow_plain_without_tls)"
                if mechanism == PLAIN
                else ""
            )
            raise UnsupportedSaslMechanismError(
                f"SASL mechanism {mechanism!r} is not offered here{why}; offered: "
                f"{', '.join(offered)}"
            )
        session.sasl_mechanism = mechanism
        session.sasl = None
        return offered

    async def sasl_step(self, session: Session, data: bytes) -> tuple[bytes, bool]:
        """One SASL message of the exchange: the answer and whether it is complete.

        Raises:
            UnsupportedSaslMechanismError: no SASL_HANDSHAKE first.
            TooManyAuthFailuresError, AuthenticationFailedError.
        """
        mechanism = session.sasl_mechanism
        if isinstance(session.sasl, TooManyAuthFailuresError):  # its handshake was refused
            refused, session.sasl = session.sasl, None
            raise TooManyAuthFailuresError(refused.message)
        if not mechanism:
            raise UnsupportedSaslMechanismError(
                "SASL_AUTHENTICATE before SASL_HANDSHAKE: choose a mechanism first"
            )
        if mechanism == PLAIN:
            session.sasl_mechanism = ""
            parts = data.split(b"\0")
            if len(parts) != 3:
                exc = AuthenticationFailedError(
                    "malformed PLAIN message: expected authzid NUL authcid NUL key"
                )
                self._check_not_blocked(session, None)
                self._failed(session, None, exc)
                raise exc
            await self.authenticate_key(session, parts[2].decode(errors="replace"), PLAIN)
            return b"", True
        if session.sasl is None:
            # A source over its limit is refused before any SCRAM work (parsing, the key's
            # lookup, a stand-in's derivation): a flood of refused attempts costs little.
            self._check_not_blocked(session, None)

            def lookup(username: str) -> ScramCredential | None:
                cred = self.store.scram_credential(username, mechanism)
                if cred is None:
                    return None
                salt, iterations, stored, server = cred
                return ScramCredential(mechanism, salt, iterations, stored, server)

            server = ScramServer(
                mechanism,
                lookup,
                secret=self.store.stand_in_secret,
                iterations=self.config.scram_iterations,
            )
            try:
                reply = server.first(data)
            except AuthenticationFailedError as exc:
                self._check_not_blocked(session, None)
                self._failed(session, None, exc)
                session.sasl_mechanism = ""
                raise
            owner = self._owner(server.username or "")
            self._check_not_blocked(session, owner)
            session.sasl = server
            return reply, False
        server = session.sasl
        session.sasl, session.sasl_mechanism = None, ""
        key_id = server.username or ""
        owner = self._owner(key_id)
        try:
            reply = server.final(data)
        except AuthenticationFailedError as exc:
            self._failed(session, owner, exc)
            raise
        principal = self.store.key_principal(key_id)
        if principal is None:  # revoked between the two messages
            gone = AuthenticationFailedError(f"API key id {key_id} is not usable")
            self._failed(session, owner, gone)
            raise gone
        self._succeeded(session, principal, key_id, mechanism)
        return reply, True

    def _owner(self, key_id: str) -> str | None:
        rec = self.store.keys.get(key_id)
        return rec.principal if rec is not None else None

    def enter(self, session: Session, principal: Principal | None) -> None:
        """Make ``session`` the current request's (in this task's context): handlers that
        filter listings read it, and audit events name its principal, source and
        interface."""
        CURRENT_SESSION.set(session)
        name = principal.name if principal is not None else None
        actor = session.actor
        if (
            actor is None
            or actor.principal != name
            or actor.source != session.source
            or actor.interface != session.interface
        ):
            # One per session (and principal), not one per request.
            actor = session.actor = Actor(
                principal=name, source=session.source, interface=session.interface
            )
        current_actor.set(actor)

    # --- quotas -------------------------------------------------------------------------------

    def _sync_quotas(self) -> None:
        if self._quota_version == self.store.version:
            return
        self._quota_version = self.store.version
        default = self.quotas.default
        for name in self._overridden - set(self.store.quotas):
            self.quotas.clear(name)
        self._overridden = set(self.store.quotas)
        for name, rec in self.store.quotas.items():
            self.quotas.set(
                name,
                QuotaLimits(
                    produce_bytes_per_s=_or(rec.produce_bytes_per_s, default.produce_bytes_per_s),
                    fetch_bytes_per_s=_or(rec.fetch_bytes_per_s, default.fetch_bytes_per_s),
                    requests_per_s=_or(rec.requests_per_s, default.requests_per_s),
                ),
            )

    def throttle(
        self, principal: Principal | None, *, produced: int = 0, fetched: int = 0
    ) -> float:
        """Record one request of ``principal`` (and the bytes it produced or fetched);
        returns how long to delay its answer, seconds (Kafka's quota model)."""
        if principal is None:
            return 0.0
        self._sync_quotas()
        name = principal.name
        delay = self.quotas.record_request(name)
        if produced:
            delay = max(delay, self.quotas.record_produce(name, produced))
        if fetched:
            delay = max(delay, self.quotas.record_fetch(name, fetched))
        return delay

    def stats(self) -> dict[str, float]:
        """The gate's counters (for metrics): authentications ok, failed and rate-limited,
        requests denied, and seconds of quota throttling by kind."""
        out: dict[str, float] = {
            "authentications_ok": self.auth_ok,
            "authentication_failures": self.auth_failures,
            "authentications_rate_limited": self.auth_rate_limited,
            "requests_denied": self.denied,
        }
        for (_, kind), seconds in self.quotas.throttle_seconds_total().items():
            key = f"throttle_seconds_{kind}"
            out[key] = out.get(key, 0.0) + seconds
        return out

    # --- audit --------------------------------------------------------------------------------

    def audit(
        self,
        session: Session,
        action: str,
        resource: str,
        outcome: str,
        reason: str,
        *,
        principal: str | None = None,
    ) -> None:
        """Record an audit event, when the broker keeps an audit log."""
        audit = getattr(self.broker, "audit", None)
        if audit is None:
            return
        audit.record(
            AuditEvent(
                time_ms=int(time.time() * 1000),
                principal=principal or session.principal_name or None,
                source=session.source,
                interface=session.interface,
                action=action,
                resource=resource,
                outcome=outcome,
                reason=redact(reason),
            )
        )


_GATES: weakref.WeakKeyDictionary[Broker, Gate] = weakref.WeakKeyDictionary()


def gate_for(broker: Broker) -> Gate:
    """The gate of ``broker``: one per broker, shared by all its listeners."""
    gate = _GATES.get(broker)
    if gate is None:
        gate = _GATES[broker] = Gate(broker, broker.security_config)
    return gate


def _or(value: int, default: int) -> int:
    return default if value == -1 else value


def names_allowed(
    gate: Gate | None,
    resource: ResourceType,
    names: Iterable[str],
    op: Operation = Operation.DESCRIBE,
) -> list[str]:
    """The ``names`` the current request's principal may ``op`` (all when there is no gate)."""
    session = CURRENT_SESSION.get()
    if gate is None:
        return [n for n in names if not (resource is ResourceType.TOPIC and is_private_topic(n))]
    return [n for n in names if gate.can(session, resource, n, op)]
