"""The authorizer: may this principal do this operation on this resource?

Superusers may do everything. Otherwise the entries that apply to the principal are its own
(by name), those of anyone (``*``), and those of its roles (``role:NAME``, with the built-in
roles' grants on every resource): a matching deny refuses, else a matching allow permits,
else the request is refused (default deny).
"""

from __future__ import annotations

from dataclasses import dataclass

from tidewire.security.model import (
    BUILTIN_ROLES,
    IMPLIES_DESCRIBE,
    Acl,
    Effect,
    Operation,
    Principal,
    ResourceType,
)
from tidewire.security.store import SecurityStore

__all__ = ["Authorizer", "Decision"]


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    #: Why, for the audit log and the error message: the entry that decided, or "no ACL".
    reason: str


class Authorizer:
    """Decides from the ACLs of ``store`` (read on every call: a change applies to the next
    request) and the superusers of its settings."""

    def __init__(self, store: SecurityStore) -> None:
        self.store = store
        self.superusers = store.config.superuser_names

    def roles_of(self, principal: Principal) -> tuple[str, ...]:
        return principal.roles

    def decide(
        self, principal: Principal, resource_type: ResourceType, name: str, op: Operation
    ) -> Decision:
        if principal.name in self.superusers:
            return Decision(True, "superuser")
        names = {principal.name, "*", *(f"role:{r}" for r in principal.roles)}
        allow: Acl | None = None
        for acl in self.store.acls:
            if acl.principal not in names or not acl.matches(resource_type, name):
                continue
            if not acl.covers(op):
                continue
            if acl.effect is Effect.DENY:
                return Decision(False, f"denied by ACL: {acl.describe()}")
            allow = acl
        if allow is not None:
            return Decision(True, f"allowed by ACL: {allow.describe()}")
        for role in principal.roles:
            for rtype, granted in BUILTIN_ROLES.get(role, ()):
                if rtype is resource_type and (
                    granted is Operation.ALL
                    or granted is op
                    or (op is Operation.DESCRIBE and granted in IMPLIES_DESCRIBE)
                ):
                    return Decision(True, f"allowed by built-in role {role}")
        return Decision(False, f"no ACL allows {principal.name} {op} on {resource_type}:{name}")
