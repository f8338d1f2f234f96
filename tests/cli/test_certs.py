"""``tidewire certs init``: the files, their modes and contents, refusing to overwrite; then
a real ``tidewire serve`` with them, and the client commands over TLS and mutual TLS with the
flags and environment variables it prints."""

from __future__ import annotations

import json
import re
import ssl
import stat
from pathlib import Path

from cryptography import x509

from tests.cli._support import run_cli, serving


def _init(tmp_path: Path, *args: str) -> dict[str, object]:
    result = run_cli(["certs", "init", str(tmp_path / "pki"), *args, "--json"])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


def test_init_writes_a_ca_a_server_and_clients(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    result = run_cli(["certs", "init", str(pki), "--client", "alice", "--client", "bob"])
    assert result.exit_code == 0, result.output
    assert "tidewire serve --tls-cert-file" in result.stdout
    assert f"--tls-ca {pki / 'ca.pem'}" in result.stdout
    names = ["ca", "server", "alice", "bob"]
    assert sorted(p.name for p in pki.iterdir()) == sorted(
        f"{n}.{e}" for n in names for e in ("pem", "key")
    )
    for n in names:
        assert stat.S_IMODE((pki / f"{n}.key").stat().st_mode) == 0o600
    ca = x509.load_pem_x509_certificate((pki / "ca.pem").read_bytes())
    server = x509.load_pem_x509_certificate((pki / "server.pem").read_bytes())
    alice = x509.load_pem_x509_certificate((pki / "alice.pem").read_bytes())
    assert server.issuer == ca.subject
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(a) for a in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "::1"]
    assert alice.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == "alice"
    days = (server.not_valid_after_utc - server.not_valid_before_utc).days
    assert 364 <= days <= 366
    # Each pair loads, and the CA verifies the chain (ssl does the checking).
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    ctx.load_cert_chain(str(pki / "alice.pem"), str(pki / "alice.key"))


def test_init_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    first = _init(tmp_path, "--hosts", "broker.internal,10.0.0.7", "--days", "30")
    assert first["hosts"] == ["broker.internal", "10.0.0.7"]
    before = (tmp_path / "pki" / "ca.pem").read_bytes()
    again = run_cli(["certs", "init", str(tmp_path / "pki")])
    assert again.exit_code == 2
    assert "ca.pem" in again.stderr
    assert "--force" in again.stderr
    assert (tmp_path / "pki" / "ca.pem").read_bytes() == before
    forced = _init(tmp_path, "--force")
    assert (tmp_path / "pki" / "ca.pem").read_bytes() != before
    assert forced["days"] == 365


def test_init_rejects_bad_arguments(tmp_path: Path) -> None:
    cases = [
        (["--client", "../evil"], "--client '../evil'"),
        (["--client", "server"], "not 'ca' or 'server'"),
        (["--days", "0"], "--days=0 must be within 1..3650"),
        (["--hosts", " , "], "--hosts: give at least one"),
    ]
    for args, message in cases:
        result = run_cli(["certs", "init", str(tmp_path / "pki"), *args])
        assert result.exit_code == 2, args
        assert message in result.stderr, result.stderr
    assert not (tmp_path / "pki").exists()


def test_serve_and_the_client_commands_over_tls(tmp_path: Path) -> None:
    doc = _init(tmp_path)
    pki = tmp_path / "pki"
    args = str(doc["serve_flags"]).split()
    with serving(tmp_path / "data", *args, "--http-port", "0") as (proc, port):
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert re.search(r"HTTP native listening on https://127\.0\.0\.1:\d+", line), line
        addr = ["--addr", f"127.0.0.1:{port}"]
        created = run_cli(["topic", "create", "secure", *addr, *str(doc["client_flags"]).split()])
        assert created.exit_code == 0, created.output
        # The same through the environment.
        listed = run_cli(["topic", "list", *addr], env={"TIDEWIRE_TLS_CA": str(pki / "ca.pem")})
        assert listed.exit_code == 0, listed.output
        assert listed.stdout.split() == ["secure"]
        published = run_cli(["publish", "secure", "hello", *addr, "--tls-ca", str(pki / "ca.pem")])
        assert published.exit_code == 0, published.output
        # Without the CA: the system's CAs do not know this one.
        refused = run_cli(["topic", "list", *addr, "--tls"])
        assert refused.exit_code == 1
        assert "certificate verify failed" in refused.stderr
        missing = run_cli(["topic", "list", *addr, "--tls-ca", str(tmp_path / "nope.pem")])
        assert missing.exit_code == 2
        assert "nope.pem" in missing.stderr


def test_serve_with_client_certificates(tmp_path: Path) -> None:
    doc = _init(tmp_path, "--client", "alice")
    pki = tmp_path / "pki"
    with serving(tmp_path / "data", *str(doc["serve_flags"]).split()) as (_, port):
        addr = ["--addr", f"127.0.0.1:{port}"]
        ok = run_cli(["topic", "list", *addr, *str(doc["client_flags"]).split()])
        assert ok.exit_code == 0, ok.output
        env = {
            "TIDEWIRE_TLS_CA": str(pki / "ca.pem"),
            "TIDEWIRE_TLS_CERT": str(pki / "alice.pem"),
            "TIDEWIRE_TLS_KEY": str(pki / "alice.key"),
        }
        assert run_cli(["health", *addr], env=env).exit_code == 0
        no_cert = run_cli(["topic", "list", *addr, "--tls-ca", str(pki / "ca.pem")])
        assert no_cert.exit_code == 1
        assert "requires a client certificate" in no_cert.stderr
