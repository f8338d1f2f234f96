"""Certificates for the TLS tests, made once per module in its temporary directory: a CA and
the broker's certificate for 127.0.0.1 and localhost, a client certificate (CN=alice), and
the bad ones the refusals need (another CA, an expired certificate, one for another host)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import pytest

from tidewire.client import TlsOptions
from tidewire.security.certs import Issued, issue, make_ca, write_key, write_pem
from tidewire.security.config import TlsConfig


@dataclass(frozen=True)
class Pki:
    dir: Path

    def path(self, name: str) -> str:
        return str(self.dir / name)

    def server(self, cert: str = "server", **settings: str) -> TlsConfig:
        """The broker's TLS settings with certificate ``cert`` (and any other setting)."""
        return TlsConfig(
            tls_cert_file=self.path(f"{cert}.pem"),
            tls_key_file=self.path(f"{cert}.key"),
            **settings,
        )

    def mtls(self, mode: str = "required", field: str = "CN") -> TlsConfig:
        return self.server(
            tls_ca_file=self.path("ca.pem"), tls_client_auth=mode, tls_principal_field=field
        )

    def client(self, cert: str | None = None, **options: str) -> TlsOptions:
        """A client's TLS options trusting the CA (and presenting ``cert``)."""
        if cert is None:
            return TlsOptions(ca_file=self.path("ca.pem"), **options)
        return TlsOptions(
            ca_file=self.path("ca.pem"),
            cert_file=self.path(f"{cert}.pem"),
            key_file=self.path(f"{cert}.key"),
            **options,
        )


def _save(d: Path, name: str, issued: Issued) -> None:
    write_pem(d / f"{name}.pem", issued.cert_pem)
    write_key(d / f"{name}.key", issued.key_pem)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca = make_ca()
    _save(d, "ca", ca)
    _save(d, "server", issue(ca, "127.0.0.1", hosts=("127.0.0.1", "localhost")))
    _save(d, "alice", issue(ca, "alice", client=True))
    _save(d, "other-host", issue(ca, "broker.example", hosts=("broker.example",)))
    past = dt.datetime.now(dt.UTC) - dt.timedelta(days=2)
    _save(
        d,
        "expired",
        issue(
            ca,
            "127.0.0.1",
            hosts=("127.0.0.1",),
            not_before=past - dt.timedelta(days=30),
            not_after=past,
        ),
    )
    other = make_ca("another CA")
    _save(d, "other-ca", other)
    _save(d, "mallory", issue(other, "mallory", client=True))  # a client the CA did not sign
    return Pki(d)
