"""Development certificates, with the ``cryptography`` package: a CA, server certificates
whose subject alternative names are the broker's host names and addresses, and client
certificates (CN = the principal's name) for mutual TLS. Keys are ECDSA P-256 (fast to make,
accepted by every TLS 1.2+ stack). For trying TLS and for tests, not for production: a real
deployment's CA is its organisation's.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "DEFAULT_DAYS",
    "Issued",
    "issue",
    "make_ca",
    "write_key",
    "write_pem",
]

#: How long development certificates are valid by default (days).
DEFAULT_DAYS = 365
#: Certificates start this long before now, so a clock a little behind still accepts them.
BACKDATE = dt.timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class Issued:
    """A certificate and its private key."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "tidewire development"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _validity(
    days: int, not_before: dt.datetime | None, not_after: dt.datetime | None
) -> tuple[dt.datetime, dt.datetime]:
    now = dt.datetime.now(dt.UTC)
    start = not_before if not_before is not None else now - BACKDATE
    end = not_after if not_after is not None else now + dt.timedelta(days=days)
    return start, end


def make_ca(
    common_name: str = "tidewire development CA",
    *,
    days: int = DEFAULT_DAYS,
    not_before: dt.datetime | None = None,
    not_after: dt.datetime | None = None,
) -> Issued:
    """A self-signed CA that may sign end-entity certificates only (path length 0).

    Raises:
        ValueError: ``days`` below 1.
    """
    if days < 1:
        raise ValueError(f"days={days} must be at least 1")
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _validity(days, not_before, not_after)
    name = _name(common_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert, key)


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def issue(
    ca: Issued,
    common_name: str,
    *,
    hosts: tuple[str, ...] = (),
    client: bool = False,
    days: int = DEFAULT_DAYS,
    not_before: dt.datetime | None = None,
    not_after: dt.datetime | None = None,
) -> Issued:
    """A certificate signed by ``ca``: a server's (``hosts``: its DNS names and IP
    addresses, as subject alternative names) or, with ``client``, a client's (its common
    name is the principal the broker sees).

    Raises:
        ValueError: a server certificate without hosts, or ``days`` below 1.
    """
    if days < 1:
        raise ValueError(f"days={days} must be at least 1")
    if not client and not hosts:
        raise ValueError("a server certificate needs at least one host name or address")
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _validity(days, not_before, not_after)
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
    )
    if hosts:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False
        )
    return Issued(builder.sign(ca.key, hashes.SHA256()), key)


def write_pem(path: Path, data: bytes) -> None:
    """Write a certificate (readable by all, as certificates are public)."""
    path.write_bytes(data)
    path.chmod(0o644)


def write_key(path: Path, data: bytes) -> None:
    """Write a private key readable by its owner alone (0600), never briefly wider."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    path.chmod(0o600)  # whatever the umask
