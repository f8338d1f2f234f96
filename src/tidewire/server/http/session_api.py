"""``/v1/session``: a browser logs in with an API key, reads its session, logs out.

The cookie, its CSRF token and their checks are described in ``server/http/session.py``.
The routes are public in the gate's table: each checks the cookie (or the key) itself, so a
logged-out browser learns it with a 401 from ``GET`` and a login goes through the gate's
failed-authentication limit and audit like any other authentication.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from tidewire.errors import AuthenticationFailedError, TidewireError
from tidewire.security.model import Effect, Operation, Principal, ResourceType
from tidewire.server.gate import Gate, Session, gate_for, source_of
from tidewire.server.http._common import json_response, parse_body, request_body, responses
from tidewire.server.http.context import GatewayContext
from tidewire.server.http.models import ErrorBody
from tidewire.server.http.session import (
    COOKIE,
    CSRF_HEADER,
    BrowserSession,
    SessionStore,
    cookie_token,
    sessions_for,
)

__all__ = ["LoginBody", "PermissionSummary", "SessionDoc", "session_router"]


class LoginBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    api_key: str = Field(
        min_length=1, max_length=512, description="An API key (twk_<id>_<secret>)."
    )


class PermissionSummary(BaseModel):
    """What the principal may do somewhere (on at least one resource of the kind): for a
    page to hide what would be refused. The server checks every request all the same."""

    create_topics: bool
    alter_topics: bool
    delete_topics: bool
    publish: bool
    read_messages: bool
    alter_groups: bool
    describe_cluster: bool = Field(description="Settings, principals, ACLs, quotas, storage.")
    alter_cluster: bool = Field(description="Manage principals, keys, ACLs, quotas.")
    read_audit: bool = Field(description="Read the audit log (admin on the cluster).")


class SessionDoc(BaseModel):
    principal: str = Field(description="Who is logged in ('anonymous' with authentication off).")
    authentication: bool = Field(description="Whether the broker requires authentication.")
    csrf_token: str | None = Field(
        description="What X-CSRF-Token must say on the session's POST, PUT, PATCH and DELETE "
        "requests (null with authentication off)."
    )
    expires_at: int | None = Field(
        description="When the session ends if idle until then, ms since the epoch (null with "
        "authentication off)."
    )
    permissions: PermissionSummary


_LOGIN_ANSWERS = responses() | {
    401: {"model": ErrorBody, "description": "A wrong, unknown, expired or revoked key."},
    429: {"model": ErrorBody, "description": "Too many failed authentications lately."},
}
_GET_ANSWERS = responses() | {
    401: {
        "model": ErrorBody,
        "description": "Not logged in, the session expired, or its key was revoked.",
    },
}
_LOGOUT_ANSWERS = responses() | {
    403: {"model": ErrorBody, "description": "X-CSRF-Token missing or wrong."},
}

#: The summary's entries: (field, resource type, operation).
_SUMMARY = (
    ("create_topics", ResourceType.TOPIC, Operation.CREATE),
    ("alter_topics", ResourceType.TOPIC, Operation.ALTER),
    ("delete_topics", ResourceType.TOPIC, Operation.DELETE),
    ("publish", ResourceType.TOPIC, Operation.WRITE),
    ("read_messages", ResourceType.TOPIC, Operation.READ),
    ("alter_groups", ResourceType.GROUP, Operation.ALTER),
    ("describe_cluster", ResourceType.CLUSTER, Operation.DESCRIBE),
    ("alter_cluster", ResourceType.CLUSTER, Operation.ALTER),
    ("read_audit", ResourceType.CLUSTER, Operation.ADMIN),
)


def _may_somewhere(gate: Gate, p: Principal, rtype: ResourceType, op: Operation) -> bool:
    """Whether ``p`` may ``op`` some resource of ``rtype``: on every one (a built-in role, a
    ``*`` entry, superuser), or by an allow entry naming some."""
    if gate.authorizer.decide(p, rtype, "*", op).allowed:
        return True
    names = {p.name, "*", *(f"role:{r}" for r in p.roles)}
    return any(
        a.principal in names
        and a.resource_type is rtype
        and a.effect is Effect.ALLOW
        and a.covers(op)
        for a in gate.store.acls
    )


def permissions(gate: Gate, principal: Principal | None) -> dict[str, bool]:
    """The :class:`PermissionSummary` of ``principal`` (None: anonymous, all allowed)."""
    if principal is None or not gate.enabled:
        return {name: True for name, _, _ in _SUMMARY}
    return {name: _may_somewhere(gate, principal, rt, op) for name, rt, op in _SUMMARY}


def _http_session(request: Request) -> Session:
    scope = request.scope
    return Session(
        source=source_of(scope.get("client")),
        interface="http",
        tls=bool(scope.get("tidewire.tls")) or scope.get("scheme") == "https",
    )


def session_router(ctx: GatewayContext) -> APIRouter:
    """Browser sessions."""
    router = APIRouter(prefix="/v1/session", tags=["session"])
    broker = ctx.broker
    config = ctx.config

    def store() -> SessionStore:
        return sessions_for(
            broker, idle_ms=config.http_session_idle_ms, max_sessions=config.http_max_sessions
        )

    def doc(principal: Principal | None, s: BrowserSession | None) -> dict[str, object]:
        gate = gate_for(broker)
        return {
            "principal": principal.name if principal is not None else "anonymous",
            "authentication": gate.enabled,
            "csrf_token": s.csrf_token if s is not None else None,
            "expires_at": s.expires_at_ms(store().clock()) if s is not None else None,
            "permissions": permissions(gate, principal),
        }

    def current(request: Request) -> tuple[str, BrowserSession, Principal]:
        """The request's session and its principal as the store says now.

        Raises:
            AuthenticationFailedError: no cookie, an unknown or expired session, or its key
                revoked (the session ends then).
        """
        token = cookie_token(request.scope["headers"])
        if token is None:
            raise AuthenticationFailedError(
                f"not logged in: no {COOKIE} cookie (POST /v1/session with an API key)"
            )
        s = store().get(token)
        http = _http_session(request)
        http.principal_name, http.key_id, http.mechanism = s.principal, s.key_id, "session"
        try:
            principal = gate_for(broker).principal(http)
        except TidewireError:
            store().end(token)
            raise
        assert principal is not None
        return token, s, principal

    @router.post(
        "",
        response_model=SessionDoc,
        responses=_LOGIN_ANSWERS,
        openapi_extra={"requestBody": request_body(LoginBody)},
    )
    async def login(request: Request) -> Response:
        """Log in with an API key: sets the ``tidewire_session`` cookie (HttpOnly,
        SameSite=Strict, Secure over TLS) and answers the session with its CSRF token. A
        wrong key is answered 401 after ``auth_failure_delay_ms`` and counts towards the
        failed-authentication limit (429 beyond it). With authentication off: the anonymous
        session, no cookie."""
        req = parse_body(LoginBody, await request.body())
        gate = gate_for(broker)
        if not gate.enabled:
            return json_response(doc(None, None))
        http = _http_session(request)
        try:
            principal = await gate.authenticate_key(http, req.api_key, "session")
        except TidewireError as exc:
            await gate.hold_back(exc)
            raise
        token, s = store().create(principal.name, http.key_id)
        response = json_response(doc(principal, s))
        response.set_cookie(
            COOKIE,
            token,
            httponly=True,
            samesite="strict",
            secure=http.tls,
            path="/",
        )
        return response

    @router.get("", response_model=SessionDoc, responses=_GET_ANSWERS)
    async def get_session(request: Request) -> Response:
        """The session of the ``tidewire_session`` cookie (401 when there is none, it expired
        or its key was revoked); with authentication off, the anonymous one (``principal``
        ``anonymous``, ``authentication`` false): no login needed."""
        if not gate_for(broker).enabled:
            return json_response(doc(None, None))
        _, s, principal = current(request)
        return json_response(doc(principal, s))

    @router.delete("", status_code=204, response_class=Response, responses=_LOGOUT_ANSWERS)
    async def logout(request: Request) -> Response:
        """Log out: ends the cookie's session (it needs ``X-CSRF-Token``, as every change
        does) and clears the cookie. Without a live session there is nothing to end: 204."""
        token = cookie_token(request.scope["headers"])
        if token is not None and gate_for(broker).enabled:
            try:
                _, s, _ = current(request)
            except AuthenticationFailedError:
                s = None
            if s is not None:
                s.check_csrf(request.headers.get(CSRF_HEADER))
                store().end(token)
                http = _http_session(request)
                http.principal_name = s.principal
                gate_for(broker).audit(http, "logout", f"principal:{s.principal}", "ok", "session")
        response = Response(status_code=204)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return response

    return router
