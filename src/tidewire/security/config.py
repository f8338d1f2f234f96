"""Settings of transport security (``[tls]``) and of authentication, authorization, audit
and quotas (``[security]``), validated on construction.

TLS, when ``tls_cert_file`` is set, applies to every listener of the broker: the binary
protocol, the HTTP API (REST, WebSocket, SSE) and the compatibility listeners.
"""

from __future__ import annotations

import ipaddress
from dataclasses import InitVar, dataclass

from tidewire.errors import InvalidConfigError

__all__ = [
    "CLIENT_AUTH_MODES",
    "TLS_VERSIONS",
    "SecurityConfig",
    "TlsConfig",
    "check_exposure",
    "is_loopback",
]

#: Minimum TLS versions that may be configured.
TLS_VERSIONS = ("1.2", "1.3")
#: ``tls_client_auth``: none (no client certificate asked), optional (asked, verified when
#: sent), required (a connection without a valid one is refused).
CLIENT_AUTH_MODES = ("none", "optional", "required")


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise InvalidConfigError(what)


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """Server-side TLS of every listener.

    Attributes:
        tls_cert_file: PEM certificate chain of the broker ("": TLS off).
        tls_key_file: PEM private key of that certificate.
        tls_ca_file: PEM CA bundle that client certificates are verified against ("": the
            system's); needed for ``tls_client_auth`` optional or required.
        tls_min_version: the oldest TLS version accepted, ``1.2`` or ``1.3``.
        tls_client_auth: ``none``, ``optional`` or ``required`` client certificates (mTLS);
            a verified client certificate's subject names a principal (see
            ``tls_principal_field``).
        tls_principal_field: which field of a client certificate's subject is the
            principal's name: ``CN`` (common name) or ``DN`` (the whole RFC 4514 name).
    """

    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_ca_file: str = ""
    tls_min_version: str = "1.2"
    tls_client_auth: str = "none"
    tls_principal_field: str = "CN"
    #: Check the settings that go together (off only to check one setting on its own).
    check_pairs: InitVar[bool] = True

    def __post_init__(self, check_pairs: bool) -> None:
        _need(
            self.tls_min_version in TLS_VERSIONS,
            f"tls_min_version={self.tls_min_version!r} must be one of {', '.join(TLS_VERSIONS)}",
        )
        _need(
            self.tls_client_auth in CLIENT_AUTH_MODES,
            f"tls_client_auth={self.tls_client_auth!r} must be one of "
            f"{', '.join(CLIENT_AUTH_MODES)}",
        )
        _need(
            self.tls_principal_field in ("CN", "DN"),
            f"tls_principal_field={self.tls_principal_field!r} must be CN or DN",
        )
        if not check_pairs:
            return
        _need(
            bool(self.tls_cert_file) == bool(self.tls_key_file),
            "tls_cert_file and tls_key_file go together: set both (TLS on) or neither",
        )
        _need(
            self.tls_client_auth == "none" or self.enabled,
            f"tls_client_auth={self.tls_client_auth!r} needs TLS: set tls_cert_file and "
            "tls_key_file",
        )

    @property
    def enabled(self) -> bool:
        """Whether the listeners speak TLS."""
        return bool(self.tls_cert_file)


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    """Authentication, authorization, audit and quotas.

    Attributes:
        authentication: every request must come from an authenticated principal (API key
            over SCRAM or PLAIN on the binary protocol, ``Authorization: Bearer`` over HTTP,
            or a verified client certificate); ACLs decide what each may do (default deny).
        allow_anonymous: start with authentication off on a non-loopback address (refused
            otherwise); a warning is logged at every start.
        superusers: comma-separated principal names allowed everything, whatever the ACLs.
        allow_plain_without_tls: accept SASL PLAIN (the API key itself on the wire) on a
            connection without TLS; off by default, SCRAM is safe without TLS.
        scram_iterations: PBKDF2 iterations of the SCRAM credentials of new keys (>= 4,096,
            RFC 7677).
        auth_failures_per_minute: failed authentications allowed per source address, and
            per principal, in a minute; beyond it attempts are refused (and audited) until
            the minute passes.
        auth_failure_delay_ms: how long the answer to a failed (or refused) authentication
            is held back (as Kafka's ``connection.failed.authentication.delay.ms``): a
            guesser waits that long per attempt on each connection, at no CPU cost.
        audit_retention_ms: how long audit records are kept (-1: forever).
        quota_produce_bytes_per_s: default produce quota of every principal, bytes per
            second (0: none); a principal's own quota wins.
        quota_fetch_bytes_per_s: likewise for bytes fetched.
        quota_requests_per_s: likewise for requests of any kind.
    """

    authentication: bool = False
    allow_anonymous: bool = False
    superusers: str = ""
    allow_plain_without_tls: bool = False
    scram_iterations: int = 4096
    auth_failures_per_minute: int = 20
    auth_failure_delay_ms: int = 1000
    audit_retention_ms: int = 30 * 24 * 3600 * 1000
    quota_produce_bytes_per_s: int = 0
    quota_fetch_bytes_per_s: int = 0
    quota_requests_per_s: int = 0

    def __post_init__(self) -> None:
        _need(
            4096 <= self.scram_iterations <= 1_000_000,
            f"scram_iterations={self.scram_iterations:,} must be within 4,096..1,000,000",
        )
        _need(
            1 <= self.auth_failures_per_minute <= 1_000_000,
            f"auth_failures_per_minute={self.auth_failures_per_minute} must be within 1..1,000,000",
        )
        _need(
            0 <= self.auth_failure_delay_ms <= 60_000,
            f"auth_failure_delay_ms={self.auth_failure_delay_ms} must be within 0..60,000",
        )
        _need(
            self.audit_retention_ms == -1 or self.audit_retention_ms >= 60_000,
            f"audit_retention_ms={self.audit_retention_ms} must be -1 (forever) or >= 60,000",
        )
        for name in (
            "quota_produce_bytes_per_s",
            "quota_fetch_bytes_per_s",
            "quota_requests_per_s",
        ):
            value = getattr(self, name)
            _need(value >= 0, f"{name}={value} must be >= 0 (0: no quota)")
        for name in self.superuser_names:
            _need(
                name.isprintable() and len(name) <= 255,
                f"superusers: {name!r} is not a principal name",
            )

    @property
    def superuser_names(self) -> frozenset[str]:
        """The names in ``superusers``."""
        return frozenset(n.strip() for n in self.superusers.split(",") if n.strip())


def is_loopback(host: str) -> bool:
    """Whether a listener bound to ``host`` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(hosts: list[str], security: SecurityConfig) -> list[str]:
    """The safe-default rule: authentication off on a non-loopback listener needs
    ``allow_anonymous``. Returns the warnings to log at start.

    Raises:
        InvalidConfigError: a non-loopback listener, authentication off and
            ``allow_anonymous`` not set; the message names the addresses.
    """
    exposed = sorted({h for h in hosts if not is_loopback(h)})
    if not exposed or security.authentication:
        return []
    if not security.allow_anonymous:
        raise InvalidConfigError(
            f"listening on {', '.join(exposed)} (not loopback) with authentication off would "
            "let anyone who can reach it read, write and delete every topic: turn "
            "authentication on ([security] authentication = true), or set allow_anonymous = "
            "true to accept that"
        )
    return [
        f"authentication is off and the broker listens on {', '.join(exposed)}: anyone who "
        "can reach it may read, write and delete every topic (allow_anonymous = true)"
    ]
