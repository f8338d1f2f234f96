"""Browser sessions: ``/v1/session`` logs a browser in with an API key and gives it a cookie.

A page cannot keep an API key safely (script can read whatever it stores), so the dashboard
logs in once: ``POST /v1/session`` with the key answers a ``tidewire_session`` cookie
(``HttpOnly``: no script reads it; ``SameSite=Strict``: no other site's page sends it;
``Secure`` on a TLS listener) and a CSRF token. The gate (``server/http/auth.py``) then takes
the cookie as the credential of a request without ``Authorization``, and for every mutating
method (POST, PUT, PATCH, DELETE) also requires the header ``X-CSRF-Token`` equal to the
session's token, so a request forged by another page fails even if a browser sent the
cookie along. Bearer requests need no token (no browser adds that header by itself).

A session is the API key it logged in with: revoking the key (or deleting its principal)
ends it at its next request, as for any other credential (the gate checks the key against
the security store each time). Sessions are kept in memory (a restart logs everyone out),
expire after ``http_session_idle_ms`` without a request, and number at most
``http_max_sessions`` (logging one more in ends the least recently used).

The store holds a SHA-256 of each token, never the token: a dump of the broker's memory
does not hand out live sessions as easily, and lookups compare digests.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidewire.errors import AuthenticationFailedError, AuthorizationFailedError
from tidewire.server.http.config import DEFAULT_MAX_SESSIONS, DEFAULT_SESSION_IDLE_MS

if TYPE_CHECKING:
    from tidewire.broker import Broker

__all__ = [
    "COOKIE",
    "CSRF_HEADER",
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_SESSION_IDLE_MS",
    "MUTATING",
    "BrowserSession",
    "SessionStore",
    "cookie_token",
    "sessions_for",
]

#: The cookie's name.
COOKIE = "tidewire_session"
#: The header a cookie-authenticated mutating request must carry.
CSRF_HEADER = "x-csrf-token"
#: Methods that change something: they need the CSRF token with a cookie.
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: Random bytes of a session token and of a CSRF token (256 bits).
TOKEN_BYTES = 32


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "replace")).digest()


@dataclass(slots=True)
class BrowserSession:
    """One logged-in browser.

    Attributes:
        principal: who logged in.
        key_id: the API key it logged in with (its revocation ends the session).
        csrf_token: what ``X-CSRF-Token`` must say on its mutating requests.
        created_ms: when it logged in, ms since the epoch.
        last_used: the monotonic time of its last request, seconds.
        idle_ms: its idle expiry, ms.
    """

    principal: str
    key_id: str
    csrf_token: str
    created_ms: int
    last_used: float
    idle_ms: int

    def expires_at_ms(self, monotonic_now: float) -> int:
        """When it expires if no request comes before, ms since the epoch."""
        left_s = self.last_used + self.idle_ms / 1000 - monotonic_now
        return int(time.time() * 1000 + max(0.0, left_s) * 1000)

    def check_csrf(self, given: str | None) -> None:
        """Raise AuthorizationFailedError (403) unless ``given`` is the session's token."""
        if given is None:
            raise AuthorizationFailedError(
                "a request authenticated by the session cookie that changes something needs "
                "the header X-CSRF-Token (the csrf_token of POST or GET /v1/session)"
            )
        if not hmac.compare_digest(given.encode("utf-8", "replace"), self.csrf_token.encode()):
            raise AuthorizationFailedError(
                "the X-CSRF-Token header does not match this session's csrf_token"
            )


class SessionStore:
    """The browser sessions of one broker (see the module docstring).

    Args:
        idle_ms: a session ends after this long without a request.
        max_sessions: sessions kept at once; one more ends the least recently used.
        clock: monotonic seconds (injected by tests).
    """

    def __init__(
        self,
        *,
        idle_ms: int = DEFAULT_SESSION_IDLE_MS,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.idle_ms = idle_ms
        self.max_sessions = max_sessions
        self.clock = clock
        #: Digest of the token -> session, least recently used first.
        self._sessions: OrderedDict[bytes, BrowserSession] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def create(self, principal: str, key_id: str) -> tuple[str, BrowserSession]:
        """A new session: its token (the cookie's value, given out this once) and itself."""
        self._expire()
        while len(self._sessions) >= self.max_sessions:
            self._sessions.popitem(last=False)
        token = secrets.token_urlsafe(TOKEN_BYTES)
        s = BrowserSession(
            principal=principal,
            key_id=key_id,
            csrf_token=secrets.token_urlsafe(TOKEN_BYTES),
            created_ms=int(time.time() * 1000),
            last_used=self.clock(),
            idle_ms=self.idle_ms,
        )
        self._sessions[_digest(token)] = s
        return token, s

    def get(self, token: str) -> BrowserSession:
        """The live session of ``token``, its idle time restarted.

        Raises:
            AuthenticationFailedError: no such session, or it expired.
        """
        d = _digest(token)
        s = self._sessions.get(d)
        now = self.clock()
        if s is None or now - s.last_used > s.idle_ms / 1000:
            self._sessions.pop(d, None)
            raise AuthenticationFailedError(
                "the session cookie is unknown or expired (sessions end after "
                f"{self.idle_ms // 60_000:,} minutes idle, at logout and at a restart): "
                "log in again"
            )
        s.last_used = now
        self._sessions.move_to_end(d)
        return s

    def end(self, token: str) -> bool:
        """End the session of ``token``; whether there was one."""
        return self._sessions.pop(_digest(token), None) is not None

    def end_key(self, key_id: str) -> int:
        """End every session of API key ``key_id`` (revoked); how many."""
        gone = [d for d, s in self._sessions.items() if s.key_id == key_id]
        for d in gone:
            del self._sessions[d]
        return len(gone)

    def _expire(self) -> None:
        now = self.clock()
        while self._sessions:
            d, s = next(iter(self._sessions.items()))
            if now - s.last_used <= s.idle_ms / 1000:
                break
            del self._sessions[d]


_STORES: weakref.WeakKeyDictionary[Broker, SessionStore] = weakref.WeakKeyDictionary()


def sessions_for(
    broker: Broker,
    *,
    idle_ms: int = DEFAULT_SESSION_IDLE_MS,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
) -> SessionStore:
    """The session store of ``broker``: one per broker, shared by its listeners (the
    settings of the first caller make it)."""
    store = _STORES.get(broker)
    if store is None:
        store = _STORES[broker] = SessionStore(idle_ms=idle_ms, max_sessions=max_sessions)
    return store


def cookie_token(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The ``tidewire_session`` cookie of raw ASGI headers, if any."""
    for name, value in headers:
        if name != b"cookie":
            continue
        for part in value.decode("latin-1").split(";"):
            k, sep, v = part.strip().partition("=")
            if sep and k == COOKIE and v:
                return v
    return None
