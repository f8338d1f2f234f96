"""SCRAM-SHA-256 and SCRAM-SHA-512: the RFC 7677 test vector byte for byte, round trips,
and every way a peer can fail an exchange, each with a clear message that carries no
secret."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewire.errors import AuthenticationFailedError, UnsupportedSaslMechanismError
from tidewire.security.scram import (
    MECHANISMS,
    ScramClient,
    ScramCredential,
    ScramServer,
    derive_credential,
    saslprep,
)

# RFC 7677, section 3.
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_FIRST = (
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
RFC_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="

PASSWORD = "s3cr3t-Pa55word_xyz"


def rfc_credential() -> ScramCredential:
    return derive_credential("SCRAM-SHA-256", "pencil", iterations=4096, salt=RFC_SALT)


def rfc_server() -> ScramServer:
    return ScramServer("SCRAM-SHA-256", {"user": rfc_credential()}.get, nonce=RFC_SERVER_NONCE)


def server_for(mechanism: str, users: dict[str, str], **kwargs: object) -> ScramServer:
    credentials = {
        name: derive_credential(mechanism, password, iterations=4096)
        for name, password in users.items()
    }
    return ScramServer(mechanism, credentials.get, **kwargs)  # type: ignore[arg-type]


def exchange(client: ScramClient, server: ScramServer) -> None:
    client.verify(server.final(client.final(server.first(client.first()))))


def assert_no_secret(error: AuthenticationFailedError, *secrets: bytes | str) -> None:
    text = str(error)
    for secret in secrets:
        as_text = secret if isinstance(secret, str) else base64.b64encode(secret).decode()
        assert as_text not in text


# --- RFC 7677 -------------------------------------------------------------------------------------


def test_rfc7677_client_messages() -> None:
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce=RFC_CLIENT_NONCE)
    assert client.first() == RFC_CLIENT_FIRST
    assert client.final(RFC_SERVER_FIRST) == RFC_CLIENT_FINAL
    client.verify(RFC_SERVER_FINAL)


def test_rfc7677_server_messages() -> None:
    server = rfc_server()
    assert server.first(RFC_CLIENT_FIRST) == RFC_SERVER_FIRST
    assert server.username == "user"
    assert not server.authenticated
    assert server.final(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    assert server.authenticated


def test_credential_repr_hides_keys() -> None:
    credential = rfc_credential()
    assert "stored_key" not in repr(credential)
    assert "server_key" not in repr(credential)
    assert len(credential.stored_key) == 32


# --- round trips ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_round_trip(mechanism: str) -> None:
    server = server_for(mechanism, {"alice": PASSWORD})
    client = ScramClient(mechanism, "alice", PASSWORD)
    exchange(client, server)
    assert server.authenticated
    assert server.username == "alice"


def test_sha512_keys_are_64_bytes() -> None:
    credential = derive_credential("SCRAM-SHA-512", PASSWORD, iterations=4096)
    assert len(credential.stored_key) == len(credential.server_key) == 64
    assert len(credential.salt) == 16
    other = derive_credential("SCRAM-SHA-512", PASSWORD, iterations=4096)
    assert other.salt != credential.salt  # fresh random salt each time


@settings(max_examples=25, deadline=None)
@given(username=st.text(alphabet=st.sampled_from("ab,=3DC2é "), min_size=1, max_size=12))
def test_round_trip_usernames_with_commas_and_equals(username: str) -> None:
    credential = derive_credential("SCRAM-SHA-256", PASSWORD, iterations=4096, salt=b"salt")
    server = ScramServer("SCRAM-SHA-256", {username: credential}.get)
    client = ScramClient("SCRAM-SHA-256", username, PASSWORD)
    first = client.first()
    assert first.count(b",") == 3  # commas in the name are escaped
    exchange_from(client, server, first)
    assert server.username == username
    assert server.authenticated


def exchange_from(client: ScramClient, server: ScramServer, first: bytes) -> None:
    client.verify(server.final(client.final(server.first(first))))


def test_username_escaping_on_the_wire() -> None:
    client = ScramClient("SCRAM-SHA-256", "a,b=c", PASSWORD, nonce="abc")
    assert client.first() == b"n,,n=a=2Cb=3Dc,r=abc"


def manual_final(password: str, header: bytes, bare: bytes, server_first: bytes) -> bytes:
    """A client-final-message computed from RFC 5802's formulas, for headers ScramClient
    never sends (authzid, 'y' flag)."""
    attrs = dict(a.split("=", 1) for a in server_first.decode().split(","))
    salted = hashlib.pbkdf2_hmac(
        "sha256", password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"])
    )
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    without_proof = b"c=" + base64.b64encode(header) + b",r=" + attrs["r"].encode()
    auth_message = bare + b"," + server_first + b"," + without_proof
    signature = hmac.digest(hashlib.sha256(client_key).digest(), auth_message, "sha256")
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    return without_proof + b",p=" + base64.b64encode(proof)


@pytest.mark.parametrize("header", [b"y,,", b"n,a=bob,", b"y,a=bob,"])
def test_y_flag_and_authzid_equal_to_username_are_accepted(header: bytes) -> None:
    server = server_for("SCRAM-SHA-256", {"bob": PASSWORD}, nonce="S")
    server_first = server.first(header + b"n=bob,r=C")
    assert server_first.startswith(b"r=CS,")
    final = manual_final(PASSWORD, header, b"n=bob,r=C", server_first)
    assert server.final(final).startswith(b"v=")
    assert server.authenticated


def test_channel_binding_must_repeat_the_header() -> None:
    server = server_for("SCRAM-SHA-256", {"bob": PASSWORD}, nonce="S")
    server_first = server.first(b"y,,n=bob,r=C")
    final = manual_final(PASSWORD, b"n,,", b"n=bob,r=C", server_first)
    with pytest.raises(AuthenticationFailedError, match="channel binding does not match"):
        server.final(final)


# --- failures -------------------------------------------------------------------------------------


def test_wrong_password_fails_without_leaking() -> None:
    server = server_for("SCRAM-SHA-256", {"alice": PASSWORD})
    client = ScramClient("SCRAM-SHA-256", "alice", "wrong-password")
    client_final = client.final(server.first(client.first()))
    with pytest.raises(AuthenticationFailedError) as caught:
        server.final(client_final)
    assert str(caught.value) == "SCRAM authentication failed for user 'alice'"
    assert_no_secret(
        caught.value, PASSWORD, "wrong-password", client_final.split(b"p=")[1].decode()
    )
    assert not server.authenticated
    with pytest.raises(AuthenticationFailedError, match="out of order"):
        server.final(client_final)  # a failed exchange stays failed


def test_unknown_user_fails_like_a_wrong_password() -> None:
    secret = b"k" * 32
    known = server_for("SCRAM-SHA-256", {"alice": PASSWORD}, secret=secret)
    unknown = server_for("SCRAM-SHA-256", {"alice": PASSWORD}, secret=secret)
    known_first = known.first(ScramClient("SCRAM-SHA-256", "alice", PASSWORD).first())
    unknown_first = unknown.first(ScramClient("SCRAM-SHA-256", "mallory", PASSWORD).first())
    # Same shape: nonce, 16-byte salt and the same iteration count.
    shape = [(k, len(v)) for k, v in (a.split(b"=", 1) for a in known_first.split(b","))]
    assert shape == [(k, len(v)) for k, v in (a.split(b"=", 1) for a in unknown_first.split(b","))]
    client = ScramClient("SCRAM-SHA-256", "mallory", PASSWORD)
    unknown = server_for("SCRAM-SHA-256", {"alice": PASSWORD}, secret=secret)
    final = client.final(unknown.first(client.first()))
    with pytest.raises(AuthenticationFailedError) as caught:
        unknown.final(final)
    assert str(caught.value) == "SCRAM authentication failed for user 'mallory'"


def test_unknown_user_salt_is_stable_per_secret() -> None:
    def salt_of(secret: bytes) -> bytes:
        server = ScramServer("SCRAM-SHA-256", lambda _: None, secret=secret, iterations=8192)
        first = server.first(b"n,,n=ghost,r=abc")
        assert first.endswith(b",i=8192")
        return first.split(b",")[1]

    assert salt_of(b"a" * 32) == salt_of(b"a" * 32)
    assert salt_of(b"a" * 32) != salt_of(b"b" * 32)


def test_credential_of_another_mechanism_counts_as_unknown() -> None:
    credential = derive_credential("SCRAM-SHA-256", PASSWORD, iterations=4096)
    server = ScramServer("SCRAM-SHA-512", {"alice": credential}.get)
    client = ScramClient("SCRAM-SHA-512", "alice", PASSWORD)
    with pytest.raises(AuthenticationFailedError, match="failed for user 'alice'"):
        server.final(client.final(server.first(client.first())))


def proof_exchange(tamper: bytes, by: bytes) -> None:
    server = rfc_server()
    server.first(RFC_CLIENT_FIRST)
    server.final(RFC_CLIENT_FINAL.replace(tamper, by))


@pytest.mark.parametrize(
    ("tamper", "by", "message"),
    [
        (b"hNlF$k0,", b"hNlF$k1,", "nonce does not match"),
        (b"r=rOpr", b"r=XOpr", "nonce does not match"),
        (b"c=biws", b"c=eSws", "channel binding does not match"),
        (b"c=biws", b"c=bi!ws", "attribute c is not base64"),
        (b"p=dHzb", b"p=dHzc", "authentication failed for user 'user'"),
        (b"AndVQ=", b"AndVQ", "attribute p is not base64"),
        (b"p=dHzbZapWIk4jUhN+", b"p=", "authentication failed for user 'user'"),
        (b",p=", b",x=", "expected attribute 'p='"),
        (b"c=biws,", b"", "expected attributes c, r"),
    ],
)
def test_tampered_client_final_fails(tamper: bytes, by: bytes, message: str) -> None:
    with pytest.raises(AuthenticationFailedError, match=message) as caught:
        proof_exchange(tamper, by)
    assert "dHzbZapWIk4jUhN" not in str(caught.value)


@pytest.mark.parametrize(
    ("client_first", "message"),
    [
        (b"p=tls-unique,,n=user,r=abc", "channel binding is not supported"),
        (b"x,,n=user,r=abc", "flag must be 'n' or 'y'"),
        (b"n,z=bob,n=user,r=abc", "authorization identity 'a='"),
        (b"n,a=bob,n=user,r=abc", "authorization identity differs from the username 'user'"),
        (b"n,,m=ext,n=user,r=abc", "mandatory extensions are not supported"),
        (b"n,,r=abc,n=user", "expected attribute 'n=' in position 0"),
        (b"n,,n=user", "expected attributes n, r"),
        (b"n,,n=,r=abc", "empty username"),
        (b"n,,n=us=2Xer,r=abc", "'=' in a name must be followed by 2C or 3D"),
        (b"n,,n=user,r=", "a nonce must be non-empty printable ASCII"),
        (b"n,,n=user,r=ab\x7fc", "a nonce must be non-empty printable ASCII"),
        (b"n,,n=\xff,r=abc", "not UTF-8"),
        (b"", "flag must be 'n' or 'y'"),
        (b"n,,n=user,r=" + b"a" * 5000, "5,012 bytes exceeds the limit of 4,096"),
    ],
)
def test_malformed_client_first_fails_clearly(client_first: bytes, message: str) -> None:
    server = rfc_server()
    with pytest.raises(AuthenticationFailedError, match=message):
        server.first(client_first)
    assert not server.authenticated


@pytest.mark.parametrize(
    ("server_first", "message"),
    [
        (b"r=XOprNGfwEbeRWgbNEkqO%hv,s=W22Z,i=4096", "does not extend the client's nonce"),
        (b"r=rOprNGfwEbeRWgbNEkqO,s=W22Z,i=4096", "does not extend the client's nonce"),
        (b"r=rOprNGfwEbeRWgbNEkqOx,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4095", "4,095 iterations"),
        (b"r=rOprNGfwEbeRWgbNEkqOx,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=2000000", "2,000,000 iter"),
        (b"r=rOprNGfwEbeRWgbNEkqOx,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=-1", "not a number"),
        (b"r=rOprNGfwEbeRWgbNEkqOx,s=!!,i=4096", "attribute s is not base64"),
        (b"r=rOprNGfwEbeRWgbNEkqOx,s=,i=4096", "empty salt"),
        (b"r=rOprNGfwEbeRWgbNEkqOx,i=4096", "expected attributes r, s, i"),
        (b"e=other-error", "expected attributes r, s, i"),
    ],
)
def test_client_refuses_bad_server_first(server_first: bytes, message: str) -> None:
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce=RFC_CLIENT_NONCE)
    client.first()
    with pytest.raises(AuthenticationFailedError, match=message):
        client.final(server_first)


@pytest.mark.parametrize(
    ("server_final", "message"),
    [
        (b"e=invalid-proof", "server refused the authentication: invalid-proof"),
        (b"v=6rri!TRBi23WpRR", "attribute v is not base64"),
        (b"v=" + base64.b64encode(b"\0" * 32), "signature does not match"),
        (b"x=1", "expected attribute 'v='"),
    ],
)
def test_client_verifies_the_server(server_final: bytes, message: str) -> None:
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce=RFC_CLIENT_NONCE)
    client.first()
    client.final(RFC_SERVER_FIRST)
    with pytest.raises(AuthenticationFailedError, match=message):
        client.verify(server_final)


def test_steps_out_of_order_fail() -> None:
    client = ScramClient("SCRAM-SHA-256", "user", "pencil")
    with pytest.raises(AuthenticationFailedError, match=r"final\(\) called out of order"):
        client.final(RFC_SERVER_FIRST)
    server = rfc_server()
    with pytest.raises(AuthenticationFailedError, match="out of order"):
        server.final(RFC_CLIENT_FINAL)
    server = rfc_server()
    server.first(RFC_CLIENT_FIRST)
    with pytest.raises(AuthenticationFailedError, match="out of order"):
        server.first(RFC_CLIENT_FIRST)


def test_unsupported_mechanism() -> None:
    with pytest.raises(UnsupportedSaslMechanismError, match="'SCRAM-SHA-1' is not supported"):
        ScramServer("SCRAM-SHA-1", lambda _: None)
    with pytest.raises(UnsupportedSaslMechanismError):
        ScramClient("PLAIN", "u", "p")
    with pytest.raises(UnsupportedSaslMechanismError):
        derive_credential("MD5", "p", iterations=4096)


def test_constructor_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="nonce must be non-empty printable ASCII without ','"):
        ScramClient("SCRAM-SHA-256", "u", "p", nonce="a,b")
    with pytest.raises(ValueError, match="nonce must be non-empty printable ASCII"):
        ScramServer("SCRAM-SHA-256", lambda _: None, nonce="")
    with pytest.raises(ValueError, match=r"iterations=100 is outside 4,096\.\.1,000,000"):
        ScramServer("SCRAM-SHA-256", lambda _: None, iterations=100)


def test_credential_validation() -> None:
    with pytest.raises(ValueError, match="iterations=1,000 is below the minimum 4,096"):
        derive_credential("SCRAM-SHA-256", PASSWORD, iterations=1000)
    with pytest.raises(ValueError, match="keys are 32 bytes, got 3 and 32"):
        ScramCredential("SCRAM-SHA-256", b"salt", 4096, b"abc", b"x" * 32)
    with pytest.raises(ValueError, match="non-empty salt"):
        ScramCredential("SCRAM-SHA-256", b"", 4096, b"x" * 32, b"x" * 32)


# --- SASLprep (RFC 4013, section 3 examples) ------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "prepared"),
    [("I\u00adX", "IX"), ("user", "user"), ("USER", "USER"), ("\u00aa", "a"), ("\u2168", "IX")],
)
def test_saslprep_examples(text: str, prepared: str) -> None:
    assert saslprep(text) == prepared


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("\u0007", "character 0 of the password \\(U\\+0007\\) is prohibited"),
        ("\u0627\u0031", "right-to-left"),
        ("\u00ad", "may not be empty"),
        ("", "may not be empty"),
    ],
)
def test_saslprep_refusals(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        saslprep(text)


@given(st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1))
def test_saslprep_keeps_printable_ascii(text: str) -> None:
    assert saslprep(text) == text


def test_non_ascii_space_maps_to_space() -> None:
    a = derive_credential("SCRAM-SHA-256", "pass\u2003word", iterations=4096, salt=b"s")
    b = derive_credential("SCRAM-SHA-256", "pass word", iterations=4096, salt=b"s")
    assert a == b
