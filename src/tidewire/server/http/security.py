"""Security administration over HTTP: ``/v1/principals``, ``/v1/keys``, ``/v1/acls``,
``/v1/quotas`` and ``/v1/whoami``.

The same operations as the binary protocol's (server/security_admin.py, which does the
conversions and the audit), with the same permissions, declared in ``server/http/auth.py``.
A created API key is in the answer that creates it, and never again.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import msgspec
from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from tidewire.errors import for_code
from tidewire.protocol import messages as m
from tidewire.security.model import Principal
from tidewire.server import security_admin as admin
from tidewire.server.gate import CURRENT_SESSION, gate_for
from tidewire.server.http._common import json_response, parse_body, request_body, responses
from tidewire.server.http._listing import (
    DEFAULT_PAGE,
    LimitParam,
    OffsetParam,
    QueryParam,
    matching,
    paged,
)
from tidewire.server.http.context import GatewayContext

__all__ = ["security_router"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


# --- documents ------------------------------------------------------------------------------


class ApiKeyDoc(BaseModel):
    id: str = Field(description="The key's id (12 hex digits): it names the key, it is not it.")
    principal: str
    state: Literal["active", "expired", "revoked"]
    created_ms: int = Field(description="When it was created, ms since the epoch.")
    expires_ms: int = Field(
        default=0, description="When it expires, ms since the epoch (0: never)."
    )
    revoked_ms: int = Field(default=0, description="When it was revoked (0: it was not).")
    description: str = ""


class PrincipalDoc(BaseModel):
    name: str
    kind: Literal["user", "service"]
    roles: list[str]
    created_ms: int
    description: str = ""
    keys: list[ApiKeyDoc] = Field(description="Its API keys (never a secret).")


class PrincipalList(BaseModel):
    principals: list[PrincipalDoc]
    total: int = Field(description="Principals that match the filter, over every page.")
    next: int | None = Field(description="The offset of the next page; null: this is the last.")


class CreatePrincipalBody(_Strict):
    name: str = Field(
        description="1..128 of A-Z a-z 0-9 . _ @ : = + - (not '*', not beginning 'role:')."
    )
    kind: Literal["user", "service"] = "user"
    roles: list[str] = Field(
        default_factory=list,
        description=(
            "Built-in (admin, producer, consumer, viewer, node) or named by an ACL (role:NAME)."
        ),
    )
    description: str = Field(default="", max_length=256)


class AlterPrincipalBody(_Strict):
    roles: list[str] | None = Field(default=None, description="The new roles (absent: unchanged).")
    description: str | None = Field(default=None, max_length=256)


class CreateKeyBody(_Strict):
    expires_ms: int = Field(
        default=0, ge=0, description="When it expires, ms since the epoch (0: never)."
    )
    description: str = Field(default="", max_length=256)


class CreatedKey(ApiKeyDoc):
    api_key: str = Field(description="The whole key, twk_<id>_<secret>: shown this once only.")


class KeyList(BaseModel):
    keys: list[ApiKeyDoc]


class AclDoc(_Strict):
    principal: str = Field(description="A principal's name, role:NAME or '*' (anyone).")
    resource_type: Literal["topic", "group", "cluster", "queue", "exchange", "stream"]
    pattern: str = Field(description="The resource's name, '*' (every one) or a prefix.")
    pattern_type: Literal["literal", "prefix"] = "literal"
    operation: Literal["read", "write", "create", "delete", "describe", "alter", "admin", "all"]
    effect: Literal["allow", "deny"] = "allow"


class AclChange(_Strict):
    acls: list[AclDoc] = Field(min_length=1, max_length=admin.MAX_CHANGES)


class AclChangeResult(BaseModel):
    changed: list[AclDoc] = Field(
        description="The entries added (absent before) or removed (present before)."
    )


class AclList(BaseModel):
    acls: list[AclDoc]


class QuotaDoc(BaseModel):
    principal: str = Field(description="The principal ('*': the broker's defaults).")
    produce_bytes_per_s: int = Field(description="0: none; -1: the broker's default.")
    fetch_bytes_per_s: int
    requests_per_s: int


class QuotaBody(_Strict):
    produce_bytes_per_s: int | None = Field(
        default=None,
        ge=-1,
        description="Bytes per second produced (0: none; -1: the default; absent: unchanged).",
    )
    fetch_bytes_per_s: int | None = Field(default=None, ge=-1)
    requests_per_s: int | None = Field(default=None, ge=-1)


class QuotaList(BaseModel):
    quotas: list[QuotaDoc]
    defaults: QuotaDoc


class WhoAmI(BaseModel):
    principal: str | None = Field(description="Who the request came from (null: anonymous).")
    kind: str = ""
    roles: list[str] = Field(default_factory=list)
    mechanism: str = Field(default="", description="bearer, certificate, or '' when anonymous.")
    tls: bool
    authentication: bool = Field(description="Whether the broker requires authentication.")
    superuser: bool


# --- helpers --------------------------------------------------------------------------------

#: The (empty) data section the binary handlers take.
_E = memoryview(b"")

NamePath = Annotated[str, Path(description="The principal.", min_length=1, max_length=128)]


def _doc(value: Any) -> Any:
    """A message as JSON with every field (the wire leaves defaults out)."""
    if isinstance(value, msgspec.Struct):
        return {f: _doc(getattr(value, f)) for f in value.__struct_fields__}
    if isinstance(value, list | tuple):
        return [_doc(v) for v in value]
    return value


async def _run(reply: Any) -> Any:
    """The body of a handler's reply, or its error raised (answered by the error handlers)."""
    body, _ = await reply
    if getattr(body, "error_code", 0):
        raise for_code(body.error_code)(body.error_message)
    return body


def security_router(ctx: GatewayContext) -> APIRouter:
    """Principals, API keys, ACLs, quotas and who-am-I."""
    router = APIRouter(tags=["security"])
    b = ctx.broker
    info: Any = None  # handlers take a ServerInfo they do not read

    @router.get("/v1/principals", response_model=PrincipalList, responses=responses())
    async def list_principals(
        *, limit: LimitParam = DEFAULT_PAGE, offset: OffsetParam = 0, q: QueryParam = ""
    ) -> Response:
        """The principals whose names contain ``q``, by name, ``limit`` from ``offset``, each
        with its API keys (id, state, times, description); ``total`` counts those that
        match, ``next`` is the offset of the next page (null on the last)."""
        body = await _run(admin.describe_principals(b, info, m.DescribePrincipalsRequest(), _E))
        docs = {p["name"]: p for p in _doc(body.principals)}
        page, total, after = paged(
            matching(docs, q), sort="name", keys={"name": str}, offset=offset, limit=limit
        )
        return json_response({"principals": [docs[n] for n in page], "total": total, "next": after})

    @router.post(
        "/v1/principals",
        status_code=201,
        response_model=PrincipalDoc,
        responses=responses(409),
        openapi_extra={"requestBody": request_body(CreatePrincipalBody)},
    )
    async def create_principal(request: Request) -> Response:
        """Create a user or a service account with roles."""
        req = parse_body(CreatePrincipalBody, await request.body())
        body = await _run(
            admin.create_principal(
                b,
                info,
                m.CreatePrincipalRequest(
                    name=req.name, kind=req.kind, roles=req.roles, description=req.description
                ),
                _E,
            )
        )
        return json_response(_doc(body.principal), 201)

    @router.get("/v1/principals/{name}", response_model=PrincipalDoc, responses=responses(404))
    async def get_principal(name: NamePath) -> Response:
        """A principal with its API keys."""
        body = await _run(
            admin.describe_principals(b, info, m.DescribePrincipalsRequest(names=[name]), _E)
        )
        return json_response(_doc(body.principals[0]))

    @router.patch(
        "/v1/principals/{name}",
        response_model=PrincipalDoc,
        responses=responses(404),
        openapi_extra={"requestBody": request_body(AlterPrincipalBody)},
    )
    async def alter_principal(name: NamePath, request: Request) -> Response:
        """Replace a principal's roles and/or description (the fields given)."""
        req = parse_body(AlterPrincipalBody, await request.body())
        body = await _run(
            admin.alter_principal(
                b,
                info,
                m.AlterPrincipalRequest(name=name, roles=req.roles, description=req.description),
                _E,
            )
        )
        return json_response(_doc(body.principal))

    @router.delete(
        "/v1/principals/{name}",
        status_code=204,
        response_class=Response,
        responses=responses(404),
    )
    async def delete_principal(name: NamePath) -> Response:
        """Delete a principal with its API keys, ACL entries and quota."""
        await _run(admin.delete_principal(b, info, m.DeletePrincipalRequest(name=name), _E))
        return Response(status_code=204)

    @router.get("/v1/principals/{name}/keys", response_model=KeyList, responses=responses(404))
    async def list_keys(name: NamePath) -> Response:
        """A principal's API keys (a principal may list its own)."""
        body = await _run(
            admin.describe_principals(b, info, m.DescribePrincipalsRequest(names=[name]), _E)
        )
        return json_response({"keys": _doc(body.principals[0].keys)})

    @router.post(
        "/v1/principals/{name}/keys",
        status_code=201,
        response_model=CreatedKey,
        responses=responses(404),
        openapi_extra={"requestBody": request_body(CreateKeyBody)},
    )
    async def create_key(name: NamePath, request: Request) -> Response:
        """A new API key of the principal (a principal may create its own). The answer holds
        the whole key, ``api_key``: the broker keeps only a hash and never shows it again."""
        raw = await request.body()
        req = parse_body(CreateKeyBody, raw) if raw.strip() else CreateKeyBody()
        body = await _run(
            admin.create_api_key(
                b,
                info,
                m.CreateApiKeyRequest(
                    principal=name, expires_ms=req.expires_ms, description=req.description
                ),
                _E,
            )
        )
        return json_response({**_doc(body.key), "api_key": body.secret_key}, 201)

    @router.delete(
        "/v1/keys/{key_id}",
        response_model=ApiKeyDoc,
        responses=responses(404),
    )
    async def revoke_key(
        key_id: Annotated[str, Path(description="The key's id.", min_length=1, max_length=64)],
        principal: Annotated[
            str,
            Query(
                description="The key's principal: lets a principal revoke its own key "
                "without the right to manage others'.",
                max_length=128,
            ),
        ] = "",
    ) -> Response:
        """Revoke an API key: requests with it are refused from now on, on every
        connection."""
        body = await _run(
            admin.revoke_api_key(
                b, info, m.RevokeApiKeyRequest(key_id=key_id, principal=principal), _E
            )
        )
        return json_response(_doc(body.key))

    @router.get("/v1/acls", response_model=AclList, responses=responses())
    async def list_acls(
        principal: Annotated[str, Query(description="Only this principal's entries.")] = "",
        resource_type: Annotated[str, Query(description="Only on this resource type.")] = "",
        pattern: Annotated[str, Query(description="Only with this pattern, exactly.")] = "",
        pattern_type: Annotated[str, Query(description="literal or prefix.")] = "",
        matching: Annotated[
            str, Query(description="Only entries whose pattern covers this resource name.")
        ] = "",
    ) -> Response:
        """The ACL entries that pass every filter given."""
        req = m.DescribeAclsRequest(
            principal=principal,
            resource_type=resource_type,
            pattern=pattern,
            pattern_type=pattern_type,
            matching=matching,
        )
        body = await _run(admin.describe_acls(b, info, req, _E))
        return json_response({"acls": _doc(body.acls)})

    @router.post(
        "/v1/acls",
        response_model=AclChangeResult,
        responses=responses(),
        openapi_extra={"requestBody": request_body(AclChange)},
    )
    async def add_acls(request: Request) -> Response:
        """Add ACL entries (all are checked before any is added); answers those that were
        not there already."""
        req = parse_body(AclChange, await request.body())
        entries = [m.AclEntry(**a.model_dump()) for a in req.acls]
        body = await _run(admin.alter_acls(b, info, m.AlterAclsRequest(add=entries), _E))
        return json_response({"changed": _doc(body.added)})

    @router.delete(
        "/v1/acls",
        response_model=AclChangeResult,
        responses=responses(),
        openapi_extra={"requestBody": request_body(AclChange)},
    )
    async def remove_acls(request: Request) -> Response:
        """Remove ACL entries, given in the body as they were added, or one entry given by
        the query (``?principal=alice&resource_type=topic&pattern=orders&operation=read``,
        with ``pattern_type`` and ``effect`` as in the body); answers those that were
        there."""
        raw = await request.body()
        if not raw.strip() and request.query_params:
            raw = json.dumps({"acls": [dict(request.query_params)]}).encode()
        req = parse_body(AclChange, raw)
        entries = [m.AclEntry(**a.model_dump()) for a in req.acls]
        body = await _run(admin.alter_acls(b, info, m.AlterAclsRequest(remove=entries), _E))
        return json_response({"changed": _doc(body.removed)})

    @router.get("/v1/quotas", response_model=QuotaList, responses=responses())
    async def list_quotas() -> Response:
        """The principals with quotas of their own, and the broker's defaults."""
        body = await _run(admin.describe_quotas(b, info, m.DescribeQuotasRequest(), _E))
        return json_response({"quotas": _doc(body.quotas), "defaults": _doc(body.defaults)})

    @router.put(
        "/v1/quotas/{name}",
        response_model=QuotaDoc,
        responses=responses(404),
        openapi_extra={"requestBody": request_body(QuotaBody)},
    )
    async def set_quota(name: NamePath, request: Request) -> Response:
        """Set some of a principal's quotas (those absent keep their value)."""
        req = parse_body(QuotaBody, await request.body())
        entry = m.QuotaEntry(principal=name, **req.model_dump())
        body = await _run(admin.alter_quotas(b, info, m.AlterQuotasRequest(set_quotas=[entry]), _E))
        return json_response(_doc(body.quotas[0]))

    @router.delete(
        "/v1/quotas/{name}",
        status_code=204,
        response_class=Response,
        responses=responses(404),
    )
    async def clear_quota(name: NamePath) -> Response:
        """Clear a principal's own quotas: the broker's defaults apply again."""
        await _run(admin.alter_quotas(b, info, m.AlterQuotasRequest(clear_quotas=[name]), _E))
        return Response(status_code=204)

    @router.get("/v1/whoami", response_model=WhoAmI, responses=responses())
    async def whoami(request: Request) -> Response:
        """Who the broker takes this request for."""
        gate = gate_for(b)
        principal: Principal | None = request.scope.get("state", {}).get("tidewire_principal")
        session = CURRENT_SESSION.get()
        return json_response(
            {
                "principal": principal.name if principal is not None else None,
                "kind": principal.kind if principal is not None else "",
                "roles": list(principal.roles) if principal is not None else [],
                "mechanism": session.mechanism if session is not None else "",
                "tls": request.url.scheme == "https",
                "authentication": gate.enabled,
                "superuser": principal is not None and principal.name in gate.authorizer.superusers,
            }
        )

    return router
