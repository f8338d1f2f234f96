"""Handlers of the security administration APIs: principals, API keys, ACLs and quotas.

They change and read the broker's :class:`~tidewire.security.store.SecurityStore`
(``broker.security``); what each needs is declared in :mod:`tidewire.server.needs`. Every
change, done or failed, is recorded in the audit log when the broker keeps one. The
conversions between the store's records and the wire's messages live here too, for the HTTP
routes to share.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from tidewire.errors import InvalidRequestError, TidewireError, UnknownPrincipalError
from tidewire.protocol.messages import (
    AclEntry,
    AlterAclsRequest,
    AlterAclsResponse,
    AlterPrincipalRequest,
    AlterPrincipalResponse,
    AlterQuotasRequest,
    AlterQuotasResponse,
    ApiKey,
    ApiKeyInfo,
    Body,
    CreateApiKeyRequest,
    CreateApiKeyResponse,
    CreatePrincipalRequest,
    CreatePrincipalResponse,
    DeletePrincipalRequest,
    DeletePrincipalResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
    DescribePrincipalsRequest,
    DescribePrincipalsResponse,
    DescribeQuotasRequest,
    DescribeQuotasResponse,
    PrincipalInfo,
    QuotaEntry,
    RevokeApiKeyRequest,
    RevokeApiKeyResponse,
)
from tidewire.security.model import (
    Acl,
    Effect,
    KeyRecord,
    Operation,
    PatternType,
    Principal,
    QuotaRecord,
    ResourceType,
)
from tidewire.security.store import SecurityStore

if TYPE_CHECKING:
    from tidewire.broker import Broker
    from tidewire.server.handlers import ServerInfo

__all__ = [
    "SECURITY_HANDLERS",
    "acl_entry",
    "audit",
    "key_info",
    "matching_acls",
    "parse_acl",
    "principal_info",
    "quota_entry",
    "quota_record",
]

Reply = tuple[Body | None, list[bytes]]
#: Entries one ALTER_ACLS or ALTER_QUOTAS may carry: each is a record fsynced in one batch.
MAX_CHANGES = 1000

E = TypeVar("E", bound=enum.StrEnum)


# --- audit ----------------------------------------------------------------------------------


def audit(
    broker: Broker,
    action: str,
    resource: str,
    *,
    error: TidewireError | None = None,
    detail: dict[str, str] | None = None,
) -> None:
    """Record a change (``error``: it failed) in the broker's audit log, if it keeps one.
    The principal and source are those of the request being handled."""
    log = getattr(broker, "audit", None)
    if log is None:
        return
    log.event(
        action,
        "failed" if error is not None else "ok",
        resource=resource,
        reason=error.message if error is not None else "",
        detail=detail or {},
    )


# --- conversions ----------------------------------------------------------------------------


def key_info(rec: KeyRecord, now_ms: int) -> ApiKeyInfo:
    """What may be shown of a key: never its hash nor its SCRAM credentials."""
    return ApiKeyInfo(
        id=rec.id,
        principal=rec.principal,
        state=rec.state(now_ms),
        created_ms=rec.created_ms,
        expires_ms=rec.expires_ms,
        revoked_ms=rec.revoked_ms,
        description=rec.description,
    )


def principal_info(store: SecurityStore, p: Principal, now_ms: int) -> PrincipalInfo:
    keys = sorted(
        (k for k in store.keys.values() if k.principal == p.name), key=lambda k: k.created_ms
    )
    return PrincipalInfo(
        name=p.name,
        kind=p.kind,
        roles=list(p.roles),
        created_ms=p.created_ms,
        description=p.description,
        keys=[key_info(k, now_ms) for k in keys],
    )


def _enum(cls: type[E], value: str, field: str) -> E:
    try:
        return cls(value.strip().lower())
    except ValueError:
        allowed = ", ".join(m.value for m in cls)
        raise InvalidRequestError(f"ACL {field} {value!r} is not one of {allowed}") from None


def parse_acl(e: AclEntry) -> Acl:
    """The store's ACL of a wire entry, checked.

    Raises:
        InvalidRequestError: an unknown resource type, pattern type, operation or effect,
            or a malformed principal or pattern (the message names it).
    """
    return Acl(
        principal=e.principal,
        resource_type=_enum(ResourceType, e.resource_type, "resource type"),
        pattern=e.pattern,
        pattern_type=_enum(PatternType, e.pattern_type, "pattern type"),
        operation=_enum(Operation, e.operation, "operation"),
        effect=_enum(Effect, e.effect, "effect"),
    ).check()


def acl_entry(a: Acl) -> AclEntry:
    return AclEntry(
        principal=a.principal,
        resource_type=str(a.resource_type),
        pattern=a.pattern,
        pattern_type=str(a.pattern_type),
        operation=str(a.operation),
        effect=str(a.effect),
    )


def _acl_order(a: Acl) -> tuple[str, ...]:
    return (a.principal, a.resource_type, a.pattern_type, a.pattern, a.operation, a.effect)


def matching_acls(
    store: SecurityStore,
    *,
    principal: str = "",
    resource_type: str = "",
    pattern: str = "",
    pattern_type: str = "",
    matching: str = "",
) -> list[Acl]:
    """The ACL entries that pass every filter given ("": any), sorted.

    Raises:
        InvalidRequestError: an unknown resource type or pattern type.
    """
    rtype = _enum(ResourceType, resource_type, "resource type") if resource_type else None
    ptype = _enum(PatternType, pattern_type, "pattern type") if pattern_type else None
    out = []
    for a in store.acls:
        if principal and a.principal != principal:
            continue
        if rtype is not None and a.resource_type is not rtype:
            continue
        if pattern and a.pattern != pattern:
            continue
        if ptype is not None and a.pattern_type is not ptype:
            continue
        if matching and not a.matches(a.resource_type, matching):
            continue
        out.append(a)
    return sorted(out, key=_acl_order)


def quota_entry(rec: QuotaRecord) -> QuotaEntry:
    return QuotaEntry(
        principal=rec.principal,
        produce_bytes_per_s=rec.produce_bytes_per_s,
        fetch_bytes_per_s=rec.fetch_bytes_per_s,
        requests_per_s=rec.requests_per_s,
    )


def quota_record(store: SecurityStore, e: QuotaEntry) -> QuotaRecord:
    """The principal's quotas with the values ``e`` gives changed (the others kept).

    Raises:
        UnknownPrincipalError: no such principal.
        InvalidRequestError: a value below -1.
    """
    store.principal(e.principal)
    old = store.quotas.get(e.principal) or QuotaRecord(principal=e.principal)
    rec = QuotaRecord(
        principal=e.principal,
        produce_bytes_per_s=_pick(e.produce_bytes_per_s, old.produce_bytes_per_s),
        fetch_bytes_per_s=_pick(e.fetch_bytes_per_s, old.fetch_bytes_per_s),
        requests_per_s=_pick(e.requests_per_s, old.requests_per_s),
    )
    for name in ("produce_bytes_per_s", "fetch_bytes_per_s", "requests_per_s"):
        value = getattr(rec, name)
        if value < -1:
            raise InvalidRequestError(
                f"quota {name}={value} of {e.principal!r} must be >= 0 (0: none) "
                "or -1 (the broker's default)"
            )
    return rec


def _pick(new: int | None, old: int) -> int:
    return old if new is None else new


def _too_many(what: str, n: int) -> None:
    if n > MAX_CHANGES:
        raise InvalidRequestError(f"{n:,} {what} in one request exceed {MAX_CHANGES:,}")


# --- handlers -------------------------------------------------------------------------------


def _now(store: SecurityStore) -> int:
    return store.now_ms()


async def _change(
    b: Broker,
    action: str,
    resource: str,
    run: Callable[[], Awaitable[dict[str, Any]]],
    detail: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run a change; audit it; its result fields, or the error's."""
    try:
        fields = await run()
    except TidewireError as exc:
        audit(b, action, resource, error=exc, detail=detail)
        return {"error_code": exc.code, "error_message": exc.message}
    audit(b, action, resource, detail=detail)
    return fields


async def create_principal(
    b: Broker, s: ServerInfo, req: CreatePrincipalRequest, _: memoryview
) -> Reply:
    store = b.security

    async def run() -> dict[str, Any]:
        p = await store.create_principal(
            req.name, kind=req.kind, roles=req.roles, description=req.description
        )
        return {"principal": principal_info(store, p, _now(store))}

    detail = {"kind": req.kind, "roles": ",".join(req.roles)}
    fields = await _change(b, "principal.create", f"principal:{req.name}", run, detail)
    return CreatePrincipalResponse(**fields), []


async def delete_principal(
    b: Broker, s: ServerInfo, req: DeletePrincipalRequest, _: memoryview
) -> Reply:
    store = b.security

    async def run() -> dict[str, Any]:
        store.principal(req.name)
        keys = sum(1 for k in store.keys.values() if k.principal == req.name)
        acls = sum(1 for a in store.acls if a.principal == req.name)
        await store.delete_principal(req.name)
        return {"keys_deleted": keys, "acls_deleted": acls}

    fields = await _change(b, "principal.delete", f"principal:{req.name}", run)
    return DeletePrincipalResponse(**fields), []


async def describe_principals(
    b: Broker, s: ServerInfo, req: DescribePrincipalsRequest, _: memoryview
) -> Reply:
    store = b.security
    now = _now(store)
    try:
        if req.names is None:
            chosen = sorted(store.principals.values(), key=lambda p: p.name)
        else:
            chosen = [store.principal(n) for n in dict.fromkeys(req.names)]
    except TidewireError as exc:
        return DescribePrincipalsResponse(error_code=exc.code, error_message=exc.message), []
    return DescribePrincipalsResponse(
        principals=[principal_info(store, p, now) for p in chosen]
    ), []


async def alter_principal(
    b: Broker, s: ServerInfo, req: AlterPrincipalRequest, _: memoryview
) -> Reply:
    store = b.security

    async def run() -> dict[str, Any]:
        if req.roles is None and req.description is None:
            raise InvalidRequestError("nothing to alter: give roles and/or a description")
        p = await store.alter_principal(req.name, roles=req.roles, description=req.description)
        return {"principal": principal_info(store, p, _now(store))}

    detail = {} if req.roles is None else {"roles": ",".join(req.roles)}
    fields = await _change(b, "principal.alter", f"principal:{req.name}", run, detail)
    return AlterPrincipalResponse(**fields), []


async def create_api_key(
    b: Broker, s: ServerInfo, req: CreateApiKeyRequest, _: memoryview
) -> Reply:
    store = b.security

    async def run() -> dict[str, Any]:
        if req.expires_ms < 0:
            raise InvalidRequestError(
                f"expires_ms={req.expires_ms} must be a time in ms since the epoch, or 0 (never)"
            )
        rec, whole = await store.create_key(
            req.principal, expires_ms=req.expires_ms, description=req.description
        )
        # The audit log names the key by its id; the whole key is in the answer alone.
        detail["key_id"] = rec.id
        return {"key": key_info(rec, _now(store)), "secret_key": whole}

    detail: dict[str, str] = {}
    fields = await _change(b, "key.create", f"principal:{req.principal}", run, detail)
    return CreateApiKeyResponse(**fields), []


async def revoke_api_key(
    b: Broker, s: ServerInfo, req: RevokeApiKeyRequest, _: memoryview
) -> Reply:
    store = b.security

    async def run() -> dict[str, Any]:
        rec = store.keys.get(req.key_id)
        if rec is None or (req.principal and rec.principal != req.principal):
            owner = f" of principal {req.principal!r}" if req.principal else ""
            raise UnknownPrincipalError(f"no API key with id {req.key_id!r}{owner}")
        rec = await store.revoke_key(req.key_id)
        return {"key": key_info(rec, _now(store))}

    fields = await _change(b, "key.revoke", f"key:{req.key_id}", run)
    return RevokeApiKeyResponse(**fields), []


async def alter_acls(b: Broker, s: ServerInfo, req: AlterAclsRequest, _: memoryview) -> Reply:
    store = b.security
    try:
        _too_many("ACL entries", len(req.add) + len(req.remove))
        add = [parse_acl(e) for e in req.add]
        remove = [parse_acl(e) for e in req.remove]
    except TidewireError as exc:
        action = "acl.add" if req.add else "acl.remove"
        audit(b, action, "cluster", error=exc, detail=_acl_detail(req.add + req.remove))
        return AlterAclsResponse(error_code=exc.code, error_message=exc.message), []

    async def do_add() -> dict[str, Any]:
        return {"added": [acl_entry(a) for a in await store.add_acls(add)]}

    async def do_remove() -> dict[str, Any]:
        return {"removed": [acl_entry(a) for a in await store.remove_acls(remove)]}

    fields: dict[str, Any] = {}
    if add:
        fields |= await _change(b, "acl.add", _acl_resources(add), do_add, _acl_detail(req.add))
    if remove and "error_code" not in fields:
        fields |= await _change(
            b, "acl.remove", _acl_resources(remove), do_remove, _acl_detail(req.remove)
        )
    return AlterAclsResponse(**fields), []


def _acl_resources(acls: list[Acl]) -> str:
    return ",".join(dict.fromkeys(f"{a.resource_type}:{a.pattern}" for a in acls))


def _acl_detail(entries: list[AclEntry]) -> dict[str, str]:
    return {f"entry.{i}": parse_or_raw(e) for i, e in enumerate(entries[:16])}


def parse_or_raw(e: AclEntry) -> str:
    """One line naming an ACL entry, for the audit log (parsed or not)."""
    try:
        return parse_acl(e).describe()
    except TidewireError:
        return f"{e.effect} {e.principal} {e.operation} on {e.resource_type}:{e.pattern}"


async def describe_acls(b: Broker, s: ServerInfo, req: DescribeAclsRequest, _: memoryview) -> Reply:
    try:
        acls = matching_acls(
            b.security,
            principal=req.principal,
            resource_type=req.resource_type,
            pattern=req.pattern,
            pattern_type=req.pattern_type,
            matching=req.matching,
        )
    except TidewireError as exc:
        return DescribeAclsResponse(error_code=exc.code, error_message=exc.message), []
    return DescribeAclsResponse(acls=[acl_entry(a) for a in acls]), []


async def alter_quotas(b: Broker, s: ServerInfo, req: AlterQuotasRequest, _: memoryview) -> Reply:
    store = b.security
    names = [e.principal for e in req.set_quotas] + list(req.clear_quotas)

    async def run() -> dict[str, Any]:
        _too_many("quota changes", len(names))
        records = [quota_record(store, e) for e in req.set_quotas]
        for name in req.clear_quotas:
            store.principal(name)
        for rec in records:
            await store.set_quota(rec)
        for name in req.clear_quotas:
            await store.clear_quota(name)
        return {"quotas": [quota_entry(r) for r in records]}

    detail = {
        "set": ",".join(e.principal for e in req.set_quotas),
        "clear": ",".join(req.clear_quotas),
    }
    fields = await _change(b, "quota.alter", _resources(names), run, detail)
    return AlterQuotasResponse(**fields), []


def _resources(names: Iterable[str]) -> str:
    return ",".join(f"principal:{n}" for n in dict.fromkeys(names))


def default_quotas(store: SecurityStore) -> QuotaEntry:
    """The broker's default quotas (principal ``*``), which -1 stands for."""
    c = store.config
    return QuotaEntry(
        principal="*",
        produce_bytes_per_s=c.quota_produce_bytes_per_s,
        fetch_bytes_per_s=c.quota_fetch_bytes_per_s,
        requests_per_s=c.quota_requests_per_s,
    )


async def describe_quotas(
    b: Broker, s: ServerInfo, req: DescribeQuotasRequest, _: memoryview
) -> Reply:
    store = b.security
    try:
        if req.principals is None:
            recs = [store.quotas[n] for n in sorted(store.quotas)]
        else:
            recs = []
            for n in dict.fromkeys(req.principals):
                store.principal(n)
                recs.append(store.quotas.get(n) or QuotaRecord(principal=n))
    except TidewireError as exc:
        return DescribeQuotasResponse(error_code=exc.code, error_message=exc.message), []
    return DescribeQuotasResponse(
        quotas=[quota_entry(r) for r in recs], defaults=default_quotas(store)
    ), []


SECURITY_HANDLERS: dict[int, Callable[[Broker, ServerInfo, Any, memoryview], Awaitable[Reply]]] = {
    ApiKey.CREATE_PRINCIPAL: create_principal,
    ApiKey.DELETE_PRINCIPAL: delete_principal,
    ApiKey.DESCRIBE_PRINCIPALS: describe_principals,
    ApiKey.ALTER_PRINCIPAL: alter_principal,
    ApiKey.CREATE_API_KEY: create_api_key,
    ApiKey.REVOKE_API_KEY: revoke_api_key,
    ApiKey.ALTER_ACLS: alter_acls,
    ApiKey.DESCRIBE_ACLS: describe_acls,
    ApiKey.ALTER_QUOTAS: alter_quotas,
    ApiKey.DESCRIBE_QUOTAS: describe_quotas,
}
