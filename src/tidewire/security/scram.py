"""SCRAM (RFC 5802) with SHA-256 (RFC 7677) and SHA-512: the credential stored by the
broker, and both sides of the exchange as sans-IO state machines (no sockets, no clock).

The exchange, three messages and a verification::

    client                                            server
    ScramClient.first()     ->  n,,n=user,r=CNONCE
                                                      ScramServer.first(...)
                            <-  r=CNONCE+SNONCE,s=SALT,i=ITERATIONS
    ScramClient.final(...)  ->  c=biws,r=CNONCE+SNONCE,p=PROOF
                                                      ScramServer.final(...)
                            <-  v=SERVER_SIGNATURE
    ScramClient.verify(...)

The password never crosses the wire and the server stores only :class:`ScramCredential`
(salt, iterations, StoredKey, ServerKey): a stolen credential does not let anyone log in
without first guessing the password by brute force through PBKDF2.

Channel binding (the ``-PLUS`` mechanisms) is not offered: a client may send the ``n`` or
``y`` flag, never ``p=``. Usernames are compared exactly as sent (after ``=2C``/``=3D``
unescaping); passwords are prepared with SASLprep (RFC 4013) as the RFC requires.

Every failure of the peer's side raises :class:`~tidewire.errors.AuthenticationFailedError`
with a message that names what was wrong but never contains a password, proof, signature or
key. A wrong password and an unknown user fail in the same way, at the same step.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import stringprep
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from tidewire.errors import AuthenticationFailedError, UnsupportedSaslMechanismError

__all__ = [
    "MECHANISMS",
    "MIN_ITERATIONS",
    "ScramClient",
    "ScramCredential",
    "ScramServer",
    "derive_credential",
    "saslprep",
]

#: The mechanisms offered, by their IANA SASL names.
MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
#: RFC 7677 asks for at least 4,096 PBKDF2 iterations; a client refuses a server asking fewer
#: (a downgrade that would make a captured exchange cheap to brute-force).
MIN_ITERATIONS = 4096
#: A client refuses a server asking more: 1,000,000 is the broker's own configurable maximum,
#: and a higher count would only let a hostile server burn the client's CPU.
MAX_ITERATIONS = 1_000_000
#: Salt of new credentials, in bytes (RFC 7677's example uses 16).
SALT_BYTES = 16
#: Random bytes in a nonce (24 base64url characters: printable, never a comma).
NONCE_BYTES = 18
#: Longest SCRAM message accepted, in bytes: a username, nonces, a salt and a proof fit in a
#: few hundred; anything much longer is an attempt to make the parser work.
MAX_MESSAGE_BYTES = 4096


# --- SASLprep (RFC 4013) ------------------------------------------------------------------------

_PROHIBITED = (
    stringprep.in_table_c12,  # non-ASCII spaces
    stringprep.in_table_c21_c22,  # control characters
    stringprep.in_table_c3,  # private use
    stringprep.in_table_c4,  # non-character code points
    stringprep.in_table_c5,  # surrogates
    stringprep.in_table_c6,  # inappropriate for plain text
    stringprep.in_table_c7,  # inappropriate for canonical representation
    stringprep.in_table_c8,  # change display properties or deprecated
    stringprep.in_table_c9,  # tagging characters
    stringprep.in_table_a1,  # unassigned (stored strings may not contain them)
)


def saslprep(text: str) -> str:
    """Prepare a password with SASLprep (RFC 4013, stored-string rules).

    Maps non-ASCII spaces to a space and removes characters "commonly mapped to nothing",
    normalizes to NFKC, and refuses prohibited characters and bad bidirectional text.
    Printable ASCII comes out unchanged.

    Raises:
        ValueError: the result would be empty, or a character is prohibited; the message
            names the character's position, never the text.
    """
    mapped = "".join(
        " " if stringprep.in_table_c12(c) else c for c in text if not stringprep.in_table_b1(c)
    )
    prepared = unicodedata.normalize("NFKC", mapped)
    if not prepared:
        raise ValueError("a SCRAM password may not be empty (after SASLprep)")
    for position, c in enumerate(prepared):
        if any(prohibited(c) for prohibited in _PROHIBITED):
            raise ValueError(
                f"character {position} of the password (U+{ord(c):04X}) is prohibited by SASLprep"
            )
    right_to_left = [stringprep.in_table_d1(c) for c in prepared]
    if any(right_to_left) and (
        any(stringprep.in_table_d2(c) for c in prepared)
        or not (right_to_left[0] and right_to_left[-1])
    ):
        raise ValueError(
            "the password's right-to-left text breaks the bidirectional rules of RFC 3454, 6"
        )
    return prepared


# --- credentials ---------------------------------------------------------------------------------


def _hash_name(mechanism: str) -> str:
    try:
        return _HASHES[mechanism]
    except KeyError:
        raise UnsupportedSaslMechanismError(
            f"SASL mechanism {mechanism!r} is not supported (supported: {', '.join(MECHANISMS)})"
        ) from None


def _hmac(hash_name: str, key: bytes, message: bytes) -> bytes:
    return hmac.digest(key, message, hash_name)


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What the server stores for one principal and mechanism: enough to check a proof and
    sign the answer, not enough to log in as the principal.

    Attributes:
        mechanism: one of :data:`MECHANISMS`.
        salt: the PBKDF2 salt.
        iterations: the PBKDF2 iteration count (>= 4,096).
        stored_key: H(ClientKey); left out of ``repr``.
        server_key: HMAC(SaltedPassword, "Server Key"); left out of ``repr``.

    Raises:
        UnsupportedSaslMechanismError: an unknown mechanism.
        ValueError: too few iterations, an empty salt or keys of the wrong length.
    """

    mechanism: str
    salt: bytes
    iterations: int
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)

    def __post_init__(self) -> None:
        size = hashlib.new(_hash_name(self.mechanism)).digest_size
        if self.iterations < MIN_ITERATIONS:
            raise ValueError(
                f"iterations={self.iterations:,} is below the minimum {MIN_ITERATIONS:,}"
            )
        if not self.salt:
            raise ValueError("a SCRAM credential needs a non-empty salt")
        if len(self.stored_key) != size or len(self.server_key) != size:
            raise ValueError(
                f"{self.mechanism} keys are {size} bytes, got {len(self.stored_key)} and "
                f"{len(self.server_key)}"
            )


def _salted_password(hash_name: str, password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(hash_name, saslprep(password).encode(), salt, iterations)


def derive_credential(
    mechanism: str, password: str, *, iterations: int, salt: bytes | None = None
) -> ScramCredential:
    """Derive the stored credential of ``password`` (PBKDF2-HMAC; slow on purpose).

    Args:
        mechanism: one of :data:`MECHANISMS`.
        password: the secret; prepared with SASLprep.
        iterations: PBKDF2 iterations, >= 4,096.
        salt: the salt; a fresh random one of 16 bytes when omitted.

    Raises:
        UnsupportedSaslMechanismError: an unknown mechanism.
        ValueError: fewer than 4,096 iterations, or a password SASLprep refuses.
    """
    hash_name = _hash_name(mechanism)
    if iterations < MIN_ITERATIONS:
        raise ValueError(f"iterations={iterations:,} is below the minimum {MIN_ITERATIONS:,}")
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    salted = _salted_password(hash_name, password, salt, iterations)
    return ScramCredential(
        mechanism=mechanism,
        salt=salt,
        iterations=iterations,
        stored_key=hashlib.new(hash_name, _hmac(hash_name, salted, b"Client Key")).digest(),
        server_key=_hmac(hash_name, salted, b"Server Key"),
    )


# --- message syntax ------------------------------------------------------------------------------


def _fail(message: str) -> AuthenticationFailedError:
    return AuthenticationFailedError(message)


def _escape(username: str) -> str:
    return username.replace("=", "=3D").replace(",", "=2C")


def _unescape(saslname: str, what: str) -> str:
    parts = saslname.split("=")
    out = [parts[0]]
    for part in parts[1:]:
        if part[:2] == "2C":
            out.append("," + part[2:])
        elif part[:2] == "3D":
            out.append("=" + part[2:])
        else:
            raise _fail(f"malformed {what}: '=' in a name must be followed by 2C or 3D")
    return "".join(out)


def _decode(message: bytes, what: str) -> str:
    if len(message) > MAX_MESSAGE_BYTES:
        raise _fail(f"{what} of {len(message):,} bytes exceeds the limit of {MAX_MESSAGE_BYTES:,}")
    try:
        return message.decode()
    except UnicodeDecodeError:
        raise _fail(f"malformed {what}: not UTF-8") from None


def _attributes(text: str, names: str, what: str) -> list[str]:
    """Split ``text`` into the values of the attributes ``names`` (one letter each, in
    order); attributes after them (extensions) are ignored."""
    parts = text.split(",")
    if len(parts) < len(names):
        raise _fail(f"malformed {what}: expected attributes {', '.join(names)}")
    values: list[str] = []
    for name, part in zip(names, parts, strict=False):
        if part[:2] != f"{name}=":
            if part[:2] == "m=":
                raise _fail(f"malformed {what}: mandatory extensions are not supported")
            raise _fail(f"malformed {what}: expected attribute '{name}=' in position {len(values)}")
        values.append(part[2:])
    return values


def _check_nonce(nonce: str, what: str) -> None:
    if not nonce or any(not 0x21 <= ord(c) <= 0x7E or c == "," for c in nonce):
        raise _fail(f"malformed {what}: a nonce must be non-empty printable ASCII without ','")


def _b64decode(value: str, attribute: str, what: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error:
        raise _fail(f"malformed {what}: attribute {attribute} is not base64") from None


def _own_nonce(nonce: str | None) -> str:
    """The given nonce (tests), checked, or a fresh random one."""
    if nonce is None:
        return secrets.token_urlsafe(NONCE_BYTES)
    try:
        _check_nonce(nonce, "nonce")
    except AuthenticationFailedError as e:
        raise ValueError(e.message) from None
    return nonce


class _State(Enum):
    """Where an exchange stands; each method moves it along ``_NEXT`` or to FAILED."""

    START = "start"
    FIRST = "first message handled"
    FINAL = "final message handled"
    DONE = "done"
    FAILED = "failed"


#: The one step each state allows: method name -> (state it requires, state it leads to).
_CLIENT_STEPS = {
    "first": (_State.START, _State.FIRST),
    "final": (_State.FIRST, _State.FINAL),
    "verify": (_State.FINAL, _State.DONE),
}
_SERVER_STEPS = {
    "first": (_State.START, _State.FIRST),
    "final": (_State.FIRST, _State.DONE),
}


class _Exchange:
    """The state shared by both sides: mechanism, step order, failure latching."""

    _steps: dict[str, tuple[_State, _State]]

    def __init__(self, mechanism: str) -> None:
        self._hash = _hash_name(mechanism)
        self.mechanism = mechanism
        self._state = _State.START

    def _begin(self, step: str) -> _State:
        required, after = self._steps[step]
        if self._state is not required:
            state = self._state
            self._state = _State.FAILED
            raise _fail(f"SCRAM {step}() called out of order (exchange is {state.value})")
        self._state = _State.FAILED  # until the step succeeds
        return after


# --- client --------------------------------------------------------------------------------------


class ScramClient(_Exchange):
    """The client side of one SCRAM exchange: ``first()``, ``final(server_first)``,
    ``verify(server_final)``, in that order; any failure ends the exchange.

    Args:
        mechanism: one of :data:`MECHANISMS`.
        username: the principal's name (escaped on the wire as the RFC says).
        password: the secret; prepared with SASLprep.
        nonce: the client nonce (tests only: a fresh random one by default).

    Raises:
        UnsupportedSaslMechanismError: an unknown mechanism.
        ValueError: a password SASLprep refuses, or a nonce with a comma or non-ASCII.
    """

    _steps = _CLIENT_STEPS

    def __init__(
        self, mechanism: str, username: str, password: str, *, nonce: str | None = None
    ) -> None:
        super().__init__(mechanism)
        self.username = username
        self._password = saslprep(password)
        self._nonce = _own_nonce(nonce)
        self._first_bare = f"n={_escape(username)},r={self._nonce}"
        self._auth_message = b""
        self._server_key = b""

    def first(self) -> bytes:
        """The client-first-message (``n,,n=USER,r=NONCE``)."""
        after = self._begin("first")
        self._state = after
        return f"n,,{self._first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        """The client-final-message, with the proof, answering ``server_first``.

        Raises:
            AuthenticationFailedError: a malformed message, a server nonce that does not
                extend ours, or an iteration count outside 4,096..1,000,000.
        """
        after = self._begin("final")
        what = "server-first-message"
        text = _decode(server_first, what)
        nonce, salt_b64, iterations_text = _attributes(text, "rsi", what)
        _check_nonce(nonce, what)
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise _fail("the server's nonce does not extend the client's nonce")
        salt = _b64decode(salt_b64, "s", what)
        if not salt:
            raise _fail(f"malformed {what}: empty salt")
        if not iterations_text.isdigit() or len(iterations_text) > 10:
            raise _fail(f"malformed {what}: iteration count is not a number")
        iterations = int(iterations_text)
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise _fail(
                f"the server asked for {iterations:,} iterations, outside the accepted "
                f"{MIN_ITERATIONS:,}..{MAX_ITERATIONS:,}"
            )
        without_proof = f"c=biws,r={nonce}"
        self._auth_message = f"{self._first_bare},{text},{without_proof}".encode()
        salted = hashlib.pbkdf2_hmac(self._hash, self._password.encode(), salt, iterations)
        client_key = _hmac(self._hash, salted, b"Client Key")
        stored_key = hashlib.new(self._hash, client_key).digest()
        signature = _hmac(self._hash, stored_key, self._auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_key = _hmac(self._hash, salted, b"Server Key")
        self._state = after
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        """Check the server's signature: only a server holding this password's credential
        can produce it.

        Raises:
            AuthenticationFailedError: the server reported an error (``e=``), or the
                signature is malformed or does not match.
        """
        after = self._begin("verify")
        what = "server-final-message"
        text = _decode(server_final, what)
        if text.startswith("e="):
            raise _fail(f"the server refused the authentication: {text[2:].split(',')[0]}")
        (verifier,) = _attributes(text, "v", what)
        signature = _b64decode(verifier, "v", what)
        expected = _hmac(self._hash, self._server_key, self._auth_message)
        if not hmac.compare_digest(signature, expected):
            raise _fail("the server's signature does not match: it does not know this credential")
        self._state = after


# --- server --------------------------------------------------------------------------------------

#: Secret behind the stand-in credentials of unknown users when the server is given none:
#: random per process, so their salts stay stable while the process lives.
_PROCESS_SECRET = secrets.token_bytes(32)


def _stand_in(mechanism: str, username: str, secret: bytes, iterations: int) -> ScramCredential:
    """A credential for a user that does not exist, derived from ``secret`` and the name:
    the same salt on every attempt, as a real user's, and keys no password matches."""
    hash_name = _hash_name(mechanism)
    name = username.encode()

    def part(label: bytes) -> bytes:
        return _hmac(hash_name, secret, label + b"\0" + mechanism.encode() + b"\0" + name)

    return ScramCredential(
        mechanism=mechanism,
        salt=part(b"salt")[:SALT_BYTES],
        iterations=iterations,
        stored_key=part(b"stored key"),
        server_key=part(b"server key"),
    )


class ScramServer(_Exchange):
    """The server side of one SCRAM exchange: ``first(client_first)``, then
    ``final(client_final)``; any failure ends the exchange.

    An unknown user (``lookup`` returns None, or a credential of another mechanism) gets a
    stand-in credential derived from ``secret`` and the name, so the exchange looks and
    costs the same as for a real user, and fails at ``final`` with the same message as a
    wrong password.

    Args:
        mechanism: one of :data:`MECHANISMS`.
        lookup: the stored credential of a username, for this mechanism, or None.
        secret: the key of the stand-in credentials; pass a persistent one so that an unknown
            user's salt stays the same across restarts (a random one per process by default).
        iterations: the iteration count of stand-in credentials: the broker's configured one,
            so that unknown users look like users created with the current setting.
        nonce: the server's part of the nonce (tests only: fresh and random by default).

    Raises:
        UnsupportedSaslMechanismError: an unknown mechanism.
        ValueError: ``iterations`` outside 4,096..1,000,000, or a bad ``nonce``.
    """

    _steps = _SERVER_STEPS

    def __init__(
        self,
        mechanism: str,
        lookup: Callable[[str], ScramCredential | None],
        *,
        secret: bytes | None = None,
        iterations: int = MIN_ITERATIONS,
        nonce: str | None = None,
    ) -> None:
        super().__init__(mechanism)
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise ValueError(
                f"iterations={iterations:,} is outside {MIN_ITERATIONS:,}..{MAX_ITERATIONS:,}"
            )
        self._lookup = lookup
        self._secret = _PROCESS_SECRET if secret is None else secret
        self._iterations = iterations
        self._server_nonce = _own_nonce(nonce)
        self._username: str | None = None
        self._known = False
        self._credential: ScramCredential | None = None
        self._gs2_header = ""
        self._nonce = ""
        self._first_bare = ""
        self._server_first = ""

    @property
    def username(self) -> str | None:
        """The username the client sent (None until a client-first-message parsed)."""
        return self._username

    @property
    def authenticated(self) -> bool:
        """True once ``final`` accepted the client's proof."""
        return self._state is _State.DONE

    def first(self, client_first: bytes) -> bytes:
        """Parse the client-first-message and answer with the server-first-message
        (``r=NONCE,s=SALT,i=ITERATIONS``).

        Raises:
            AuthenticationFailedError: a malformed message, channel binding asked for
                (``p=``), or an authorization identity other than the username.
        """
        after = self._begin("first")
        what = "client-first-message"
        text = _decode(client_first, what)
        flag, _, rest = text.partition(",")
        authzid, _, bare = rest.partition(",")
        if flag.startswith("p="):
            raise _fail("channel binding is not supported: use SCRAM without -PLUS ('n' flag)")
        if flag not in ("n", "y"):
            raise _fail(f"malformed {what}: the channel binding flag must be 'n' or 'y'")
        if authzid and not authzid.startswith("a="):
            raise _fail(f"malformed {what}: expected an authorization identity 'a=' or nothing")
        username_text, nonce = _attributes(bare, "nr", what)
        username = _unescape(username_text, what)
        if not username:
            raise _fail(f"malformed {what}: empty username")
        _check_nonce(nonce, what)
        self._username = username
        if authzid and _unescape(authzid[2:], what) != username:
            raise _fail(
                f"authorization identity differs from the username {username!r}: "
                "acting for another principal is not supported"
            )
        credential = self._lookup(username)
        self._known = credential is not None and credential.mechanism == self.mechanism
        if credential is None or not self._known:
            credential = _stand_in(self.mechanism, username, self._secret, self._iterations)
        self._credential = credential
        self._gs2_header = f"{flag},{authzid},"
        self._nonce = nonce + self._server_nonce
        self._first_bare = bare
        salt = base64.b64encode(credential.salt).decode()
        self._server_first = f"r={self._nonce},s={salt},i={credential.iterations}"
        self._state = after
        return self._server_first.encode()

    def final(self, client_final: bytes) -> bytes:
        """Check the client-final-message's channel binding, nonce and proof, and answer
        with the server-final-message (``v=SIGNATURE``).

        Raises:
            AuthenticationFailedError: a malformed message, a wrong channel binding or
                nonce, or a proof that does not match (wrong password or unknown user).
        """
        after = self._begin("final")
        what = "client-final-message"
        text = _decode(client_final, what)
        without_proof, _, proof_attribute = text.rpartition(",")
        binding, nonce = _attributes(without_proof, "cr", what)
        (proof_b64,) = _attributes(proof_attribute, "p", what)
        if _b64decode(binding, "c", what) != self._gs2_header.encode():
            raise _fail("the channel binding does not match the client-first-message's header")
        if nonce != self._nonce:
            raise _fail("the nonce does not match the one the server sent")
        proof = _b64decode(proof_b64, "p", what)
        assert self._credential is not None  # set by first()
        auth_message = f"{self._first_bare},{self._server_first},{without_proof}".encode()
        signature = _hmac(self._hash, self._credential.stored_key, auth_message)
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=False))
        matches = len(proof) == len(signature) and hmac.compare_digest(
            hashlib.new(self._hash, client_key).digest(), self._credential.stored_key
        )
        if not (matches and self._known):
            raise _fail(f"SCRAM authentication failed for user {self._username!r}")
        server_signature = _hmac(self._hash, self._credential.server_key, auth_message)
        self._state = after
        return f"v={base64.b64encode(server_signature).decode()}".encode()
