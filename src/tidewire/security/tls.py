"""TLS contexts, through the standard :mod:`ssl` module: the broker's (one for every
listener, made from :class:`~tidewire.security.config.TlsConfig`) and a client's (made from
:class:`TlsOptions`), and the principal a verified client certificate names.

Defaults: TLS 1.2 or newer (1.3 selectable on both sides), the :mod:`ssl` module's
cipher choice (forward-secret AEAD suites only), no compression, no renegotiation; a client
verifies the broker's certificate and its host name always (the system's CAs unless one is
given).
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from tidewire.errors import ConnectionLostError, InvalidConfigError
from tidewire.security.config import TLS_VERSIONS, TlsConfig

__all__ = [
    "CERT_REQUIRED_MESSAGE",
    "HANDSHAKE_TIMEOUT_S",
    "TlsError",
    "TlsOptions",
    "TlsPeer",
    "listener_context",
    "peer_of",
    "principal_from_peercert",
    "server_context",
]

#: How long a TLS handshake may take on a listener (seconds): long enough for a slow link,
#: short enough that a client that connects and sends nothing (or plaintext that never
#: completes a hello) does not hold a descriptor for the asyncio default of a minute.
HANDSHAKE_TIMEOUT_S = 10.0

#: Why a connection without a client certificate is refused where one is required.
CERT_REQUIRED_MESSAGE = (
    "this broker requires a client certificate (mutual TLS): connect with a certificate "
    "signed by a CA its tls_ca_file holds"
)

_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}
_VERIFY = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}

#: RFC 4514 short names of the attributes Python's ``getpeercert()`` spells out in full.
_SHORT_NAMES = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}


class TlsError(ConnectionLostError):
    """Raised by clients: the TLS handshake with the broker failed (its certificate not
    verified, a host name mismatch, a client certificate the broker requires or refused, no
    TLS version in common, TLS against a plaintext port). Sending again would fail the same
    way, so unlike its parent :class:`~tidewire.errors.ConnectionLostError` it is not
    retriable; the message names the cause. It never crosses the wire, so it has no code of
    its own."""

    retriable = False
    description = "the TLS handshake with the broker failed"


def _version(value: str, what: str) -> ssl.TLSVersion:
    if value not in _VERSIONS:
        raise InvalidConfigError(f"{what}={value!r} must be one of {', '.join(TLS_VERSIONS)}")
    return _VERSIONS[value]


def _load_chain(ctx: ssl.SSLContext, cert: str, key: str | None, who: str) -> None:
    try:
        ctx.load_cert_chain(cert, key or None)
    except FileNotFoundError as exc:
        missing = exc.filename or (cert if key is None else f"{cert} or {key}")
        raise InvalidConfigError(f"{who}: {missing}: no such file") from None
    except (OSError, ssl.SSLError, ValueError) as exc:
        files = cert if not key else f"{cert} and {key}"
        raise InvalidConfigError(
            f"{who}: cannot load the certificate and key from {files}: {exc} (PEM files, the "
            "key matching the certificate, not encrypted)"
        ) from None


def _load_ca(ctx: ssl.SSLContext, ca: str, who: str) -> None:
    try:
        ctx.load_verify_locations(cafile=ca)
    except FileNotFoundError:
        raise InvalidConfigError(f"{who}: {ca}: no such file") from None
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise InvalidConfigError(
            f"{who}: cannot load CA certificates from {ca}: {exc} (a PEM bundle)"
        ) from None


def server_context(cfg: TlsConfig) -> ssl.SSLContext:
    """The server-side context of every listener.

    Client certificates are not asked for (``none``), asked for and verified when sent
    (``optional``), or required (``required``: a handshake without a valid one fails),
    verified against ``tls_ca_file`` (the system's CAs when empty).

    Raises:
        InvalidConfigError: TLS is off in ``cfg``, or a file cannot be read or parsed (the
            message names it).
    """
    if not cfg.enabled:
        raise InvalidConfigError("TLS is off: tls_cert_file is not set")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = _version(cfg.tls_min_version, "tls_min_version")
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    ctx.options |= getattr(ssl, "OP_NO_RENEGOTIATION", 0)
    _load_chain(ctx, cfg.tls_cert_file, cfg.tls_key_file, "tls_cert_file/tls_key_file")
    ctx.verify_mode = _VERIFY[cfg.tls_client_auth]
    if cfg.tls_client_auth != "none":
        if cfg.tls_ca_file:
            _load_ca(ctx, cfg.tls_ca_file, "tls_ca_file")
        else:
            ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    elif cfg.tls_ca_file:  # checked even when unused, so a typo shows at start
        _load_ca(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), cfg.tls_ca_file, "tls_ca_file")
    return ctx


def _escape(value: str) -> str:
    """An attribute value escaped as RFC 4514 (section 2.4) asks."""
    out = []
    for i, ch in enumerate(value):
        if ch in ',+"\\<>;' or (ch == "#" and i == 0) or (ch == " " and i in (0, len(value) - 1)):
            out.append("\\" + ch)
        elif ch == "\0":
            out.append("\\00")
        else:
            out.append(ch)
    return "".join(out)


def principal_from_peercert(peercert: Mapping[str, Any] | None, field: str = "CN") -> str | None:
    """The principal a verified client certificate names.

    Args:
        peercert: what ``SSLSocket.getpeercert()`` (or a transport's ``peercert`` extra
            info) returns: ``None`` or ``{}`` when no certificate was sent or verified.
        field: ``CN``, the subject's (last) common name; ``DN``, the whole subject as an
            RFC 4514 string (most specific first: ``CN=alice,O=Example,C=DE``).

    Returns:
        The name, or None: no verified certificate, or no common name in it.

    Raises:
        ValueError: ``field`` is neither ``CN`` nor ``DN``.
    """
    if field not in ("CN", "DN"):
        raise ValueError(f"field={field!r} must be CN or DN")
    subject = (peercert or {}).get("subject") or ()
    if not subject:
        return None
    if field == "CN":
        names = [value for rdn in subject for key, value in rdn if key == "commonName"]
        return names[-1] if names else None
    rdns = [
        "+".join(f"{_SHORT_NAMES.get(key, key)}={_escape(str(value))}" for key, value in rdn)
        for rdn in subject
    ]
    return ",".join(reversed(rdns))


def listener_context(cfg: TlsConfig) -> tuple[ssl.SSLContext, bool]:
    """The context a listener uses, and whether it must refuse connections without a client
    certificate itself.

    With ``tls_client_auth = required`` the handshake asks for a certificate and verifies
    one that is sent (as ``optional``), and the listener refuses a connection that sent none
    right after the handshake, saying why: asyncio closes a connection whose handshake fails
    without sending the TLS alert, so a TLS 1.3 client (which completes its side of the
    handshake before the server checks its certificate) would only see the connection
    close.

    Raises:
        InvalidConfigError: as :func:`server_context`.
    """
    ctx = server_context(cfg)
    if cfg.tls_client_auth != "required":
        return ctx, False
    ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx, True


class TlsPeer(NamedTuple):
    """What a listener knows of a connection's TLS."""

    tls: bool  # the connection is TLS
    certified: bool  # the client sent a certificate, and it was verified
    principal: str | None  # the principal it names (see principal_from_peercert)


#: A connection without TLS.
PLAINTEXT = TlsPeer(False, False, None)


def peer_of(transport: Any, field: str = "CN") -> TlsPeer:
    """The TLS of an asyncio transport whose handshake has completed."""
    if transport.get_extra_info("sslcontext") is None:
        return PLAINTEXT
    cert = transport.get_extra_info("peercert")
    return TlsPeer(True, bool(cert), principal_from_peercert(cert, field))


@dataclass(frozen=True, slots=True)
class TlsOptions:
    """TLS of a client's connections to the broker (the binary protocol).

    Attributes:
        ca_file: PEM CAs the broker's certificate is verified against (None: the system's).
        cert_file: PEM certificate of the client, for brokers that ask for one (mTLS).
        key_file: PEM private key of ``cert_file`` (None: in ``cert_file`` itself).
        server_hostname: the name the broker's certificate must carry (None: the host of
            the address connected to; an IP address is matched against IP SANs).
        min_version: the oldest TLS version accepted, ``1.2`` or ``1.3``.

    The broker's certificate and host name are always verified.
    """

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_hostname: str | None = None
    min_version: str = "1.2"

    def __post_init__(self) -> None:
        _version(self.min_version, "min_version")
        if self.key_file and not self.cert_file:
            raise InvalidConfigError("TLS key_file given without cert_file: set both, or neither")

    @classmethod
    def of(cls, tls: TlsOptions | bool | None) -> TlsOptions | None:
        """``tls=`` as clients take it: options, True (TLS with the system's CAs), or
        False/None (no TLS)."""
        if tls is None or tls is False:
            return None
        if tls is True:
            return cls()
        if isinstance(tls, TlsOptions):
            return tls
        raise TypeError(f"tls must be TlsOptions, True, False or None, not {type(tls).__name__}")

    def context(self) -> ssl.SSLContext:
        """A client context with these options.

        Raises:
            InvalidConfigError: a file cannot be read or parsed (the message names it).
        """
        if self.ca_file:
            # Only the given CAs: a private CA is not widened to every public one (and the
            # system's, which take a tenth of a second to load, are not read at all).
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            _load_ca(ctx, self.ca_file, "TLS ca_file")
        else:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        ctx.minimum_version = _version(self.min_version, "min_version")
        ctx.check_hostname = True
        ctx.verify_mode = ssl.CERT_REQUIRED
        if self.cert_file:
            _load_chain(ctx, self.cert_file, self.key_file, "TLS cert_file/key_file")
        return ctx
