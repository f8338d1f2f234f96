"""The clients' security administration: principals, API keys, ACLs and quotas, as methods
that :class:`~tidewire.client.AsyncClient` and its blocking twin inherit.

Changes need alter on the cluster, reads describe, except that a principal lists, creates
and revokes its own keys with authentication alone (docs/security.md).
"""

from __future__ import annotations

from collections.abc import Coroutine, Iterable, Sequence
from typing import Any, TypeVar, cast

from tidewire.errors import for_code
from tidewire.protocol.messages import (
    AclEntry,
    AlterAclsRequest,
    AlterPrincipalRequest,
    AlterQuotasRequest,
    ApiKeyInfo,
    CreateApiKeyRequest,
    CreatePrincipalRequest,
    DeletePrincipalRequest,
    DescribeAclsRequest,
    DescribePrincipalsRequest,
    DescribeQuotasRequest,
    DescribeQuotasResponse,
    PrincipalInfo,
    QuotaEntry,
    RevokeApiKeyRequest,
)

__all__ = ["AsyncSecurityAdmin", "SecurityAdmin"]

T = TypeVar("T")


def _check(body: Any) -> Any:
    if body.error_code:
        raise for_code(body.error_code)(body.error_message)
    return body


class AsyncSecurityAdmin:
    """The security administration methods of :class:`~tidewire.client.AsyncClient`."""

    async def _call(self, body: Any, data: Sequence[bytes] = ()) -> Any:
        raise NotImplementedError  # the client's

    async def _ask(self, body: Any) -> Any:
        return _check((await self._call(body)).body)

    async def _call_security(self, body: Any) -> Any:
        raise NotImplementedError  # the client's

    async def _change(self, body: Any) -> Any:
        """A change (of principals, keys, ACLs, quotas): in a cluster, made on the leader of
        ``__security``, which the client finds (the other nodes refuse it)."""
        return _check(await self._call_security(body))

    async def create_principal(
        self,
        name: str,
        *,
        kind: str = "user",
        roles: Iterable[str] = (),
        description: str = "",
    ) -> PrincipalInfo:
        """Create a user (``kind="user"``) or a service account (``"service"``).

        Args:
            name: 1..128 of ``A-Z a-z 0-9 . _ @ : = + -``.
            roles: built-in (admin, producer, consumer, viewer) or named by an ACL
                (``role:NAME``).
            description: up to 256 characters.

        Raises:
            PrincipalExistsError, InvalidRequestError (a bad name, kind, role or description).
        """
        req = CreatePrincipalRequest(
            name=name, kind=kind, roles=list(roles), description=description
        )
        return (await self._change(req)).principal  # type: ignore[no-any-return]

    async def delete_principal(self, name: str) -> tuple[int, int]:
        """Delete a principal with its keys, ACLs and quota; returns how many keys and ACL
        entries went with it. Raises UnknownPrincipalError."""
        body = await self._change(DeletePrincipalRequest(name=name))
        return int(body.keys_deleted), int(body.acls_deleted)

    async def describe_principals(self, names: Sequence[str] | None = None) -> list[PrincipalInfo]:
        """The principals named (default every one), each with its keys (id, state,
        times, description; never a secret). Raises UnknownPrincipalError."""
        req = DescribePrincipalsRequest(names=None if names is None else list(names))
        return list((await self._ask(req)).principals)

    async def alter_principal(
        self,
        name: str,
        *,
        roles: Iterable[str] | None = None,
        description: str | None = None,
    ) -> PrincipalInfo:
        """Replace a principal's roles and/or description (None: leave as is).

        Raises:
            UnknownPrincipalError, InvalidRequestError (an unknown role).
        """
        req = AlterPrincipalRequest(
            name=name, roles=None if roles is None else list(roles), description=description
        )
        return (await self._change(req)).principal  # type: ignore[no-any-return]

    async def create_api_key(
        self, principal: str, *, expires_ms: int = 0, description: str = ""
    ) -> tuple[ApiKeyInfo, str]:
        """A new API key of ``principal``: its description and the whole key
        (``twk_<id>_<secret>``), which the broker never shows again.

        Args:
            expires_ms: when it expires, ms since the epoch (0: never).

        Raises:
            UnknownPrincipalError, InvalidRequestError (an expiry in the past).
        """
        req = CreateApiKeyRequest(
            principal=principal, expires_ms=expires_ms, description=description
        )
        body = await self._change(req)
        return body.key, str(body.secret_key)

    async def revoke_api_key(self, key_id: str, *, principal: str = "") -> ApiKeyInfo:
        """Revoke a key by its id: connections that authenticated with it are refused from
        their next request. With ``principal``, the key must be that principal's (a
        principal revokes its own keys so). Raises UnknownPrincipalError (no such key)."""
        req = RevokeApiKeyRequest(key_id=key_id, principal=principal)
        return (await self._change(req)).key  # type: ignore[no-any-return]

    async def alter_acls(
        self, *, add: Iterable[AclEntry] = (), remove: Iterable[AclEntry] = ()
    ) -> tuple[list[AclEntry], list[AclEntry]]:
        """Add and remove ACL entries (every entry is checked before any is changed);
        returns those added (absent before) and those removed (present before).

        Raises:
            InvalidRequestError: an entry is malformed (the message says which part).
        """
        body = await self._change(AlterAclsRequest(add=list(add), remove=list(remove)))
        return list(body.added), list(body.removed)

    async def add_acls(self, acls: Iterable[AclEntry]) -> list[AclEntry]:
        """Add ACL entries; returns those that were not there already."""
        return (await self.alter_acls(add=acls))[0]

    async def remove_acls(self, acls: Iterable[AclEntry]) -> list[AclEntry]:
        """Remove ACL entries; returns those that were there."""
        return (await self.alter_acls(remove=acls))[1]

    async def describe_acls(
        self,
        *,
        principal: str = "",
        resource_type: str = "",
        pattern: str = "",
        pattern_type: str = "",
        matching: str = "",
    ) -> list[AclEntry]:
        """The ACL entries that pass every filter given: ``principal`` (a name,
        ``role:NAME`` or ``*``), ``resource_type``, ``pattern`` and ``pattern_type``
        exactly, ``matching`` a resource name the entry's pattern covers."""
        req = DescribeAclsRequest(
            principal=principal,
            resource_type=resource_type,
            pattern=pattern,
            pattern_type=pattern_type,
            matching=matching,
        )
        return list((await self._ask(req)).acls)

    async def set_quota(
        self,
        principal: str,
        *,
        produce_bytes_per_s: int | None = None,
        fetch_bytes_per_s: int | None = None,
        requests_per_s: int | None = None,
    ) -> QuotaEntry:
        """Set some of a principal's quotas (None: keep; 0: none; -1: the broker's
        default); returns the quotas now in place.

        Raises:
            UnknownPrincipalError, InvalidRequestError (a value below -1).
        """
        entry = QuotaEntry(
            principal=principal,
            produce_bytes_per_s=produce_bytes_per_s,
            fetch_bytes_per_s=fetch_bytes_per_s,
            requests_per_s=requests_per_s,
        )
        body = await self._change(AlterQuotasRequest(set_quotas=[entry]))
        return body.quotas[0]  # type: ignore[no-any-return]

    async def clear_quota(self, principal: str) -> None:
        """Back to the broker's default quotas. Raises UnknownPrincipalError."""
        await self._change(AlterQuotasRequest(clear_quotas=[principal]))

    async def describe_quotas(
        self, principals: Sequence[str] | None = None
    ) -> DescribeQuotasResponse:
        """The quotas of the principals named (default every one with its own), and the
        broker's defaults. Raises UnknownPrincipalError."""
        req = DescribeQuotasRequest(principals=None if principals is None else list(principals))
        return await self._ask(req)  # type: ignore[no-any-return]


class SecurityAdmin:
    """The blocking twins of :class:`AsyncSecurityAdmin`'s methods."""

    _async: Any  # the asyncio twin, an AsyncSecurityAdmin

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        raise NotImplementedError  # the twin's

    @property
    def _sec(self) -> AsyncSecurityAdmin:
        return cast(AsyncSecurityAdmin, self._async)

    def create_principal(
        self,
        name: str,
        *,
        kind: str = "user",
        roles: Iterable[str] = (),
        description: str = "",
    ) -> PrincipalInfo:
        return self._run(
            self._sec.create_principal(name, kind=kind, roles=list(roles), description=description)
        )

    def delete_principal(self, name: str) -> tuple[int, int]:
        return self._run(self._sec.delete_principal(name))

    def describe_principals(self, names: Sequence[str] | None = None) -> list[PrincipalInfo]:
        return self._run(self._sec.describe_principals(names))

    def alter_principal(
        self,
        name: str,
        *,
        roles: Iterable[str] | None = None,
        description: str | None = None,
    ) -> PrincipalInfo:
        return self._run(
            self._sec.alter_principal(
                name, roles=None if roles is None else list(roles), description=description
            )
        )

    def create_api_key(
        self, principal: str, *, expires_ms: int = 0, description: str = ""
    ) -> tuple[ApiKeyInfo, str]:
        return self._run(
            self._sec.create_api_key(principal, expires_ms=expires_ms, description=description)
        )

    def revoke_api_key(self, key_id: str, *, principal: str = "") -> ApiKeyInfo:
        return self._run(self._sec.revoke_api_key(key_id, principal=principal))

    def alter_acls(
        self, *, add: Iterable[AclEntry] = (), remove: Iterable[AclEntry] = ()
    ) -> tuple[list[AclEntry], list[AclEntry]]:
        return self._run(self._sec.alter_acls(add=list(add), remove=list(remove)))

    def add_acls(self, acls: Iterable[AclEntry]) -> list[AclEntry]:
        return self._run(self._sec.add_acls(list(acls)))

    def remove_acls(self, acls: Iterable[AclEntry]) -> list[AclEntry]:
        return self._run(self._sec.remove_acls(list(acls)))

    def describe_acls(
        self,
        *,
        principal: str = "",
        resource_type: str = "",
        pattern: str = "",
        pattern_type: str = "",
        matching: str = "",
    ) -> list[AclEntry]:
        return self._run(
            self._sec.describe_acls(
                principal=principal,
                resource_type=resource_type,
                pattern=pattern,
                pattern_type=pattern_type,
                matching=matching,
            )
        )

    def set_quota(
        self,
        principal: str,
        *,
        produce_bytes_per_s: int | None = None,
        fetch_bytes_per_s: int | None = None,
        requests_per_s: int | None = None,
    ) -> QuotaEntry:
        return self._run(
            self._sec.set_quota(
                principal,
                produce_bytes_per_s=produce_bytes_per_s,
                fetch_bytes_per_s=fetch_bytes_per_s,
                requests_per_s=requests_per_s,
            )
        )

    def clear_quota(self, principal: str) -> None:
        self._run(self._sec.clear_quota(principal))

    def describe_quotas(self, principals: Sequence[str] | None = None) -> DescribeQuotasResponse:
        return self._run(self._sec.describe_quotas(principals))
