"""Kafka's message schemas made ready for one version: which fields a version has, in which
order, which are nullable, which are tagged, and what each defaults to.

The schemas themselves are data (:mod:`tidewire.protocol.kafka._schemas`, written from
Kafka's own message definitions); :func:`layout` turns one message at one version into a
:class:`Layout` the codec walks, once per (api, kind, version).
"""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass
from typing import Any

from tidewire.protocol.kafka._schemas import SCHEMAS

__all__ = ["MAX_VERSION", "FieldSpec", "Layout", "flexible", "layout", "valid_versions"]

MAX_VERSION = 0x7FFF
ZERO_UUID = uuid.UUID(int=0)

#: The primitive types (an array of one is ``[]`` + its name); ``struct`` is a nested layout.
PRIMITIVES = frozenset(
    {"int8", "int16", "uint16", "int32", "uint32", "int64", "float64", "bool", "string",
     "bytes", "records", "uuid"}
)  # fmt: skip


def parse_versions(text: str) -> tuple[int, int]:
    """``"3+"`` -> (3, MAX), ``"0-5"`` -> (0, 5), ``"7"`` -> (7, 7), ``"none"`` -> (1, 0)."""
    if text == "none":
        return 1, 0
    if text.endswith("+"):
        return int(text[:-1]), MAX_VERSION
    lo, _, hi = text.partition("-")
    return int(lo), int(hi or lo)


def _within(text: str, version: int) -> bool:
    lo, hi = parse_versions(text)
    return lo <= version <= hi


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One field as it is at one version.

    Attributes:
        kind: a primitive type name or ``struct``.
        array: whether the field is an array of ``kind``.
        nullable: whether null is allowed (and written) at this version.
        tag: the tag of a tagged field at this version, else -1.
        struct: the nested layout of a struct (or array of structs).
    """

    name: str
    kind: str
    array: bool
    nullable: bool
    tag: int
    default: Any
    struct: Layout | None

    def fresh_default(self) -> Any:
        """The default value (a new list or dict each time for arrays and structs)."""
        if self.array:
            return None if self.default is None and self.nullable else []
        if self.kind == "struct":
            if self.nullable and self.default is None:
                return None
            assert self.struct is not None
            return self.struct.defaults()
        return self.default


@dataclass(frozen=True, slots=True)
class Layout:
    """A struct (or a whole message body) at one version.

    Attributes:
        fields: the fields written in order (not tagged).
        tagged: the tagged fields by tag, in tag order.
        absent: the fields the schema has but this version does not: decoding fills them with
            their defaults so handlers need not know which version they read.
        flexible: whether this version uses compact types and tagged fields.
    """

    fields: tuple[FieldSpec, ...]
    tagged: tuple[FieldSpec, ...]
    absent: tuple[FieldSpec, ...]
    flexible: bool

    def defaults(self) -> dict[str, Any]:
        """A body with every field at its default."""
        out = {f.name: f.fresh_default() for f in self.fields}
        out.update((f.name, f.fresh_default()) for f in self.tagged)
        out.update((f.name, f.fresh_default()) for f in self.absent)
        return out


def _default(kind: str, array: bool, nullable: bool, text: str | None) -> Any:
    if array:
        return None if text == "null" else []
    if text == "null":
        return None
    if kind in ("string",):
        return "" if text is None else text
    if kind in ("bytes", "records"):
        return None if nullable and text is None else b""
    if kind == "bool":
        return text == "true"
    if kind == "uuid":
        return ZERO_UUID
    if kind == "float64":
        return float(text) if text is not None else 0.0
    if kind == "struct":
        return None if nullable else {}
    # Kafka's JSON writes most defaults as strings ("-1") and a few as numbers (-1).
    return int(text, 0) if isinstance(text, str) else int(text or 0)


def _layout(fields: tuple[Any, ...], version: int, flexible: bool) -> Layout:
    present: list[FieldSpec] = []
    tagged: list[FieldSpec] = []
    absent: list[FieldSpec] = []
    for name, kind, versions, nullable_versions, tag, tagged_versions, default, sub in fields:
        array = kind.startswith("[]")
        base = kind[2:] if array else kind
        nullable = _within(nullable_versions, version)
        is_tagged = flexible and tag >= 0 and _within(tagged_versions, version)
        struct = None if sub is None else _layout(sub, version, flexible)
        spec = FieldSpec(
            name=name,
            kind=base,
            array=array,
            nullable=nullable,
            tag=tag if is_tagged else -1,
            default=_default(base, array, nullable, default),
            struct=struct,
        )
        if not _within(versions, version):
            absent.append(spec)
        elif is_tagged:
            tagged.append(spec)
        else:
            present.append(spec)
    tagged.sort(key=lambda f: f.tag)
    return Layout(tuple(present), tuple(tagged), tuple(absent), flexible)


def valid_versions(api_key: int, kind: str = "request") -> tuple[int, int] | None:
    """The versions the schema of ``api_key`` defines, or None for an API without one."""
    schema = SCHEMAS.get((api_key, kind))
    return None if schema is None else parse_versions(schema[1])


def flexible(api_key: int, version: int) -> bool:
    """Whether ``version`` of the API is a flexible one (KIP-482)."""
    schema = SCHEMAS.get((api_key, "request"))
    return schema is not None and _within(schema[2], version)


@functools.cache
def layout(api_key: int, kind: str, version: int) -> Layout | None:
    """The layout of a request or response body, or None when there is no such version."""
    schema = SCHEMAS.get((api_key, kind))
    if schema is None or not _within(schema[1], version):
        return None
    return _layout(schema[3], version, _within(schema[2], version))
