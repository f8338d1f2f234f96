"""TLS on the binary protocol, with real clients and a real listener: a round trip, each
refusal (wrong CA, expired certificate, host name mismatch, missing client certificate, too
old a TLS version, plaintext on the TLS port) as a clear, non-retriable error and without
disturbing other connections, and the principal of a verified client certificate."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
import ssl
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tidewire.client import (
    AsyncClient,
    AsyncConsumer,
    AsyncProducer,
    Client,
    Message,
    TlsOptions,
)
from tidewire.embedded import EmbeddedBroker
from tidewire.errors import AuthenticationFailedError, ConnectionLostError, InvalidConfigError
from tidewire.protocol import Connection
from tidewire.security.config import TlsConfig
from tidewire.security.tls import TlsError, principal_from_peercert, server_context

from .conftest import Pki

#: Generous bound for a refusal that must not hang (a loaded 2-core CI box).
PROMPT_S = 20.0


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


async def _refused(pki: Pki, server: TlsConfig, client: TlsOptions | bool) -> TlsError:
    """Start a broker with ``server``; a request with ``client`` fails with TlsError, fast."""
    async with EmbeddedBroker(str(pki.dir / "data"), tls=server) as eb:
        started = time.monotonic()
        async with AsyncClient(eb.addr, tls=client) as c:
            with pytest.raises(TlsError) as info:
                await c.list_topics()
        assert time.monotonic() - started < PROMPT_S
        assert not info.value.retriable
        assert isinstance(info.value, ConnectionLostError)
        return info.value


# --- round trips ---------------------------------------------------------------------------------


def test_publish_and_consume_over_tls(pki: Pki, tmp_path: Path) -> None:
    async def main() -> None:
        async with EmbeddedBroker(str(tmp_path), tls=pki.server(), default_partitions=1) as eb:
            tls = pki.client()
            async with AsyncProducer(eb.addr, tls=tls, linger_ms=0) as producer:
                futures = [await producer.send("tls.events", b"m%d" % i) for i in range(50)]
                offsets = [(await f).offset for f in futures]
            assert offsets == list(range(50))
            async with AsyncConsumer(eb.addr, tls=tls) as consumer:
                await consumer.assign([("tls.events", 0, "earliest")])
                got: list[bytes | None] = []
                while len(got) < 50:
                    got += [r.value for r in await consumer.poll(PROMPT_S)]
            assert got == [b"m%d" % i for i in range(50)]
            # The connection is TLS on the broker's side; no client certificate was asked for.
            async with AsyncClient(eb.addr, tls=tls) as client:
                await client.list_topics()
                assert eb.server is not None
                (conn,) = eb.server.connections
                assert conn.tls is True
                assert conn.cert_principal is None

    run(main())


def test_large_produce_requests_over_tls_are_read_in_place(pki: Pki, tmp_path: Path) -> None:
    """Batches of about 1 MiB under TLS: stored as sent, and read by the broker straight into
    a buffer of the request frame's own size (the decrypted stream, as on plain TCP)."""
    values = [b"%06d" % i + b"v" * 994 for i in range(3000)]

    async def main() -> None:
        async with EmbeddedBroker(str(tmp_path), tls=pki.server(), default_partitions=1) as eb:
            seen: list[object] = []
            produce, produce_soon = eb.broker.produce, eb.broker.produce_soon

            async def spy(topic: str, partition: int, data: Any, **kwargs: Any) -> Any:
                seen.append(memoryview(data).obj)
                return await produce(topic, partition, data, **kwargs)

            def spy_soon(topic: str, partition: int, data: Any, **kwargs: Any) -> bool:
                taken = produce_soon(topic, partition, data, **kwargs)
                if taken:  # else it goes on to produce(), which records it
                    seen.append(memoryview(data).obj)
                return taken

            eb.broker.produce = spy  # type: ignore[method-assign]
            eb.broker.produce_soon = spy_soon  # type: ignore[method-assign]
            tls = pki.client()
            async with AsyncProducer(eb.addr, tls=tls, linger_ms=50) as producer:
                futures = [await producer.send("tls.big", v) for v in values]
                offsets = [(await f).offset for f in futures]
            assert offsets == list(range(len(values)))
            assert seen
            assert all(type(o) is bytearray for o in seen)
            async with AsyncConsumer(eb.addr, tls=tls) as consumer:
                await consumer.assign([("tls.big", 0, "earliest")])
                got: list[bytes | None] = []
                for _ in range(1000):
                    if len(got) >= len(values):
                        break
                    got += [r.value for r in await consumer.poll(PROMPT_S)]
            assert got == values

    run(main())


def test_blocking_client_over_tls_and_the_server_name_option(pki: Pki, tmp_path: Path) -> None:
    with EmbeddedBroker(str(tmp_path), tls=pki.server()).running() as eb:
        # 127.0.0.1 is in the certificate's SANs, and so is localhost (server_hostname).
        for tls in (pki.client(), pki.client(server_hostname="localhost")):
            with Client(eb.addr, tls=tls) as client:
                client.create_topic(f"t{len(tls.server_hostname or '')}", partitions=1)
        with Client(eb.addr, tls=pki.client()) as client:
            assert sorted(client.list_topics()) == ["t0", "t9"]


def test_plaintext_client_on_a_plaintext_broker_is_unchanged(tmp_path: Path) -> None:
    async def main() -> None:
        async with EmbeddedBroker(str(tmp_path)) as eb:
            assert eb.server is not None
            assert eb.server.ssl is None
            async with AsyncClient(eb.addr) as client:
                assert await client.list_topics() == []
                (conn,) = eb.server.connections
                assert (conn.tls, conn.cert_principal) == (False, None)

    run(main())


# --- refusals ------------------------------------------------------------------------------------


def test_a_broker_certificate_from_another_ca_is_refused(pki: Pki) -> None:
    wrong = TlsOptions(ca_file=pki.path("other-ca.pem"))
    err = asyncio.run(_refused(pki, pki.server(), wrong))
    assert "certificate verify failed" in err.message
    assert "127.0.0.1" in err.message


def test_the_system_cas_do_not_trust_a_development_ca(pki: Pki) -> None:
    err = asyncio.run(_refused(pki, pki.server(), True))
    assert "certificate verify failed" in err.message


def test_an_expired_broker_certificate_is_refused(pki: Pki) -> None:
    err = asyncio.run(_refused(pki, pki.server("expired"), pki.client()))
    assert "certificate verify failed" in err.message
    assert "expired" in err.message


def test_a_host_name_mismatch_is_refused(pki: Pki) -> None:
    # The certificate is for broker.example, the client connects to 127.0.0.1.
    err = asyncio.run(_refused(pki, pki.server("other-host"), pki.client()))
    assert "certificate verify failed" in err.message
    assert "127.0.0.1" in err.message
    # And a server name the certificate does not carry.
    err = asyncio.run(_refused(pki, pki.server(), pki.client(server_hostname="broker.example")))
    assert "broker.example" in err.message


def test_a_client_without_a_required_certificate_is_refused(pki: Pki, tmp_path: Path) -> None:
    async def main() -> None:
        async with EmbeddedBroker(str(tmp_path), tls=pki.mtls("required")) as eb:
            assert eb.server is not None
            async with AsyncClient(eb.addr, tls=pki.client()) as client:
                with pytest.raises(AuthenticationFailedError, match=r"requires a client cert"):
                    await client.list_topics()
            assert not eb.server.connections
            async with AsyncClient(eb.addr, tls=pki.client("alice")) as client:
                assert await client.list_topics() == []

    run(main())


@contextlib.contextmanager
def _refusing_without_goodbye(pki: Pki) -> Iterator[int]:
    """A TLS listener on 127.0.0.1 (its port yielded) that answers a connection's first request
    as a broker refusing it does (an error frame), then reads nothing more until the test
    ends: the client's close_notify stays unanswered, as it does while a refusing broker
    still drops what the client sends (``frame_timeout_s``) before closing."""
    ctx = server_context(pki.server())
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(PROMPT_S)
    done = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        conn.settimeout(PROMPT_S)
        with ctx.wrap_socket(conn, server_side=True) as tls:
            tls.recv(4096)  # the first request
            refusal = AuthenticationFailedError("this broker requires a client certificate")
            tls.sendall(b"".join(Connection.error_frame(refusal)))
            done.wait(PROMPT_S)

    thread = threading.Thread(target=serve, name="refusing-listener", daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        done.set()
        thread.join(PROMPT_S)
        listener.close()


def test_a_refused_client_closes_its_socket_before_close_returns(pki: Pki) -> None:
    """The refusal reaches the caller while the TLS goodbye is still going on; close() must
    not return before the socket is closed, or a loop stopped right after (a CLI command that
    exits) leaves it open, to be collected unclosed: a ResourceWarning, in a later test."""

    async def main(port: int) -> None:
        async with AsyncClient(f"127.0.0.1:{port}", tls=pki.client()) as client:
            with pytest.raises(AuthenticationFailedError, match=r"requires a client cert"):
                await client.list_topics()

    with _refusing_without_goodbye(pki) as port:
        asyncio.run(main(port))  # as the CLI runs a command: the loop is closed after it
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


def test_a_client_certificate_from_another_ca_is_refused(pki: Pki) -> None:
    asyncio.run(_refused(pki, pki.mtls("required"), pki.client("mallory")))
    # Optional client certificates are verified too when sent.
    asyncio.run(_refused(pki, pki.mtls("optional"), pki.client("mallory")))


def test_min_version_1_3_refuses_a_client_that_speaks_1_2_only(pki: Pki, tmp_path: Path) -> None:
    async def main() -> None:
        async with EmbeddedBroker(str(tmp_path), tls=pki.server(tls_min_version="1.3")) as eb:
            assert eb.server is not None
            old = ssl.create_default_context(cafile=pki.path("ca.pem"))
            old.maximum_version = ssl.TLSVersion.TLSv1_2
            with pytest.raises(ssl.SSLError):
                await asyncio.open_connection("127.0.0.1", eb.server.port, ssl=old)
            # A 1.3 client is served, and a client asking for 1.3 at least too.
            async with AsyncClient(eb.addr, tls=pki.client(min_version="1.3")) as client:
                assert await client.list_topics() == []

    run(main())


def test_a_tls_client_on_a_plaintext_port_fails_clearly(tmp_path: Path, pki: Pki) -> None:
    async def main() -> None:
        async with (
            EmbeddedBroker(str(tmp_path)) as eb,
            AsyncClient(eb.addr, tls=pki.client(), connect_timeout_s=PROMPT_S) as c,
        ):
            started = time.monotonic()
            with pytest.raises(ConnectionLostError) as info:
                await c.list_topics()
            assert time.monotonic() - started < PROMPT_S
            assert "TLS" in info.value.message

    run(main())


def test_plaintext_on_the_tls_port_is_refused_alone(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="asyncio")

    async def main() -> None:
        async with EmbeddedBroker(str(tmp_path), tls=pki.server(), default_partitions=1) as eb:
            assert eb.server is not None
            async with AsyncClient(eb.addr, tls=pki.client()) as good:
                assert await good.produce("p", 0, [Message(b"before")]) == 0
                for junk in (
                    b"\x00\x00\x00\x10" + b"\x00" * 16,  # what a plaintext client sends
                    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
                ):
                    reader, writer = await asyncio.open_connection("127.0.0.1", eb.server.port)
                    writer.write(junk)
                    # The broker closes that connection (it answers with a TLS alert at most).
                    data = await asyncio.wait_for(reader.read(), PROMPT_S)
                    assert len(data) < 64
                    writer.close()
                    await writer.wait_closed()
                # The TLS connection opened before is untouched, and new ones are served.
                assert await good.produce("p", 0, [Message(b"after")]) == 1
                assert len(eb.server.connections) == 1
            async with AsyncClient(eb.addr, tls=pki.client()) as again:
                got = await again.fetch("p", 0, 0)
                assert [r.value for r in got.records] == [b"before", b"after"]

    run(main())
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert noisy == [], [r.getMessage() for r in noisy]


def test_a_silent_connection_does_not_block_the_tls_listener(pki: Pki, tmp_path: Path) -> None:
    """A client that connects and never says hello holds only its own socket."""

    async def main() -> None:
        async with EmbeddedBroker(str(tmp_path), tls=pki.server()) as eb:
            assert eb.server is not None
            with socket.create_connection(("127.0.0.1", eb.server.port)):
                async with AsyncClient(eb.addr, tls=pki.client()) as client:
                    assert await client.list_topics() == []

    run(main())


# --- client certificates -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "expected"),
    [("CN", "alice"), ("DN", "CN=alice,O=tidewire development")],
)
def test_the_verified_client_certificate_names_the_principal(
    pki: Pki, tmp_path: Path, field: str, expected: str
) -> None:
    async def main() -> None:
        async with EmbeddedBroker(str(tmp_path), tls=pki.mtls("required", field)) as eb:
            assert eb.server is not None
            async with AsyncClient(eb.addr, tls=pki.client("alice")) as client:
                await client.list_topics()
                (conn,) = eb.server.connections
                assert (conn.tls, conn.cert_principal) == (True, expected)

    run(main())


def test_optional_client_certificates(pki: Pki, tmp_path: Path) -> None:
    async def main() -> None:
        async with EmbeddedBroker(str(tmp_path), tls=pki.mtls("optional")) as eb:
            assert eb.server is not None
            principals = []
            for cert in (None, "alice"):
                async with AsyncClient(eb.addr, tls=pki.client(cert)) as client:
                    await client.list_topics()
                    (conn,) = eb.server.connections
                    principals.append(conn.cert_principal)
            assert principals == [None, "alice"]

    run(main())


# --- settings and helpers ------------------------------------------------------------------------


def test_files_that_cannot_be_loaded_are_named(pki: Pki, tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    missing = str(tmp_path / "missing.pem")
    with pytest.raises(InvalidConfigError, match=r"missing\.pem"):
        server_context(TlsConfig(tls_cert_file=missing, tls_key_file=pki.path("server.key")))
    with pytest.raises(InvalidConfigError, match=r"junk\.pem"):
        server_context(TlsConfig(tls_cert_file=str(junk), tls_key_file=str(junk)))
    with pytest.raises(InvalidConfigError, match=r"server\.pem and .*alice\.key"):  # mismatch
        server_context(
            TlsConfig(tls_cert_file=pki.path("server.pem"), tls_key_file=pki.path("alice.key"))
        )
    with pytest.raises(InvalidConfigError, match=r"tls_ca_file: .*junk\.pem"):
        server_context(pki.server(tls_ca_file=str(junk), tls_client_auth="required"))
    with pytest.raises(InvalidConfigError, match=r"missing\.pem: no such file"):
        TlsOptions(ca_file=missing).context()
    with pytest.raises(InvalidConfigError, match=r"missing\.pem"):
        AsyncClient("127.0.0.1:1", tls=TlsOptions(ca_file=missing))
    with pytest.raises(InvalidConfigError, match=r"min_version='1\.1'"):
        TlsOptions(min_version="1.1")
    with pytest.raises(InvalidConfigError, match=r"key_file given without cert_file"):
        TlsOptions(key_file=pki.path("alice.key"))
    with pytest.raises(TypeError, match=r"not str"):
        TlsOptions.of("yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidConfigError, match=r"TLS is off"):
        server_context(TlsConfig())
    with pytest.raises(InvalidConfigError, match=r"missing\.pem"):
        EmbeddedBroker(
            str(tmp_path / "d"), tls=TlsConfig(tls_cert_file=missing, tls_key_file=missing)
        )


def test_server_context_defaults(pki: Pki) -> None:
    ctx = server_context(pki.server())
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert ctx.verify_mode == ssl.CERT_NONE
    assert ctx.options & ssl.OP_NO_COMPRESSION
    assert server_context(pki.server(tls_min_version="1.3")).minimum_version == (
        ssl.TLSVersion.TLSv1_3
    )
    assert server_context(pki.mtls("optional")).verify_mode == ssl.CERT_OPTIONAL
    assert server_context(pki.mtls("required")).verify_mode == ssl.CERT_REQUIRED
    client = pki.client().context()
    assert client.check_hostname
    assert client.verify_mode == ssl.CERT_REQUIRED
    assert TlsOptions.of(True) == TlsOptions()
    assert TlsOptions.of(None) is None
    assert TlsOptions.of(False) is None


def test_principal_from_peercert() -> None:
    cert = {
        "subject": (
            (("countryName", "DE"),),
            (("organizationName", "Example, Inc."),),
            (("organizationalUnitName", "ops"), ("userId", "42")),
            (("commonName", "svc+reader"),),
        )
    }
    assert principal_from_peercert(cert, "CN") == "svc+reader"
    assert principal_from_peercert(cert, "DN") == (
        "CN=svc\\+reader,OU=ops+UID=42,O=Example\\, Inc.,C=DE"
    )
    assert principal_from_peercert({}, "CN") is None
    assert principal_from_peercert(None, "DN") is None
    assert principal_from_peercert({"subject": ((("organizationName", "x"),),)}, "CN") is None
    assert principal_from_peercert({"subject": ((("commonName", " #a "),),)}, "DN") == (
        "CN=\\ #a\\ "
    )
    with pytest.raises(ValueError, match=r"CN or DN"):
        principal_from_peercert(cert, "UID")
