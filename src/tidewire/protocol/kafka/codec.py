"""Kafka's wire format, sans I/O: request and response frames to and from plain dicts.

A frame on the wire is a 4-byte big-endian size and then the frame: a header and a body.
:func:`decode_request` reads a frame (without its size) into a :class:`RequestHeader` and a
body dict; :func:`encode_response` writes a body dict as a response frame with its size.
Bodies follow Kafka's schemas (:mod:`tidewire.protocol.kafka.schema`) at the request's
version, with field names in snake_case; flexible versions (KIP-482: compact strings, bytes
and arrays, tagged fields, request header v2 and response header v1) are taken from the
schema. Whatever the input, decoding either returns or raises :class:`KafkaCodecError`.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from typing import Any

from tidewire.protocol.kafka.errors import ErrorCode, KafkaCodecError
from tidewire.protocol.kafka.schema import FieldSpec, Layout, flexible, layout

__all__ = [
    "API_VERSIONS_KEY",
    "RequestHeader",
    "decode_header",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
]

API_VERSIONS_KEY = 18

_I8, _I16, _U16 = struct.Struct(">b"), struct.Struct(">h"), struct.Struct(">H")
_I32, _U32, _I64 = struct.Struct(">i"), struct.Struct(">I"), struct.Struct(">q")
_F64 = struct.Struct(">d")
_HEAD = struct.Struct(">hhi")  # api key, api version, correlation id
_FIXED: dict[str, struct.Struct] = {
    "int8": _I8, "int16": _I16, "uint16": _U16, "int32": _I32, "uint32": _U32,
    "int64": _I64, "float64": _F64,
}  # fmt: skip
_RANGES = {
    "int8": (-(2**7), 2**7 - 1), "int16": (-(2**15), 2**15 - 1), "uint16": (0, 2**16 - 1),
    "int32": (-(2**31), 2**31 - 1), "uint32": (0, 2**32 - 1), "int64": (-(2**63), 2**63 - 1),
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class RequestHeader:
    """A request's header (v1 or v2: the client id is always a non-compact string)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None = None


class _Corrupt(Exception):
    """Internal: the bytes end early or hold an impossible value."""


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: memoryview, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos

    def take(self, n: int) -> memoryview:
        end = self.pos + n
        if n < 0 or end > len(self.buf):
            raise _Corrupt(f"{n} bytes wanted at byte {self.pos} of {len(self.buf)}")
        out = self.buf[self.pos : end]
        self.pos = end
        return out

    def fixed(self, s: struct.Struct) -> Any:
        if self.pos + s.size > len(self.buf):
            raise _Corrupt(f"the frame ends at byte {len(self.buf)} inside a field")
        (v,) = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return v

    def uvarint(self) -> int:
        out = shift = 0
        buf, pos = self.buf, self.pos
        while True:
            if pos >= len(buf):
                raise _Corrupt("the frame ends inside a varint")
            b = buf[pos]
            pos += 1
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                self.pos = pos
                return out
            shift += 7
            if shift > 28:
                raise _Corrupt("a varint longer than 5 bytes")

    def length(self, compact: bool, wide: bool) -> int:
        """A length prefix: -1 for null."""
        if compact:
            return self.uvarint() - 1
        return int(self.fixed(_I32 if wide else _I16))

    def text(self, compact: bool, nullable: bool) -> str | None:
        n = self.length(compact, wide=False)
        if n < 0:
            if not nullable:
                raise _Corrupt("null in a string that may not be null")
            return None
        try:
            return str(self.take(n), "utf-8")
        except UnicodeDecodeError as exc:
            raise _Corrupt(f"a string that is not UTF-8 ({exc.reason})") from None

    def blob(self, compact: bool, nullable: bool) -> memoryview | None:
        n = self.length(compact, wide=True)
        if n < 0:
            if not nullable:
                raise _Corrupt("null in bytes that may not be null")
            return None
        return self.take(n)


def _read_value(r: _Reader, f: FieldSpec, compact: bool) -> Any:
    kind = f.kind
    s = _FIXED.get(kind)
    if s is not None:
        return r.fixed(s)
    if kind == "string":
        return r.text(compact, f.nullable)
    if kind == "bool":
        return r.take(1)[0] != 0
    if kind in ("bytes", "records"):
        return r.blob(compact, f.nullable or kind == "records")
    if kind == "uuid":
        return uuid.UUID(bytes=bytes(r.take(16)))
    assert f.struct is not None
    return _read_struct(r, f.struct)


def _read_field(r: _Reader, f: FieldSpec, compact: bool) -> Any:
    if not f.array:
        if f.kind == "struct" and f.nullable and r.fixed(_I8) < 0:
            return None
        return _read_value(r, f, compact)
    n = r.length(compact, wide=True)
    if n < 0:
        if not f.nullable:
            raise _Corrupt(f"null in the array {f.name!r} that may not be null")
        return None
    if n > len(r.buf) - r.pos:  # every element takes at least a byte
        raise _Corrupt(f"an array of {n:,} elements in {len(r.buf) - r.pos:,} bytes")
    return [_read_value(r, f, compact) for _ in range(n)]


def _read_struct(r: _Reader, lay: Layout) -> dict[str, Any]:
    out: dict[str, Any] = {}
    compact = lay.flexible
    for f in lay.fields:
        out[f.name] = _read_field(r, f, compact)
    if compact:
        for f in lay.tagged:
            out[f.name] = f.fresh_default()
        _read_tags(r, lay, out)
    for f in lay.absent:
        out[f.name] = f.fresh_default()
    return out


def _read_tags(r: _Reader, lay: Layout | None, out: dict[str, Any]) -> None:
    count = r.uvarint()
    last = -1
    for _ in range(count):
        tag = r.uvarint()
        if tag <= last:
            raise _Corrupt(f"tagged field {tag} after tag {last}: tags must ascend")
        last = tag
        size = r.uvarint()
        data = r.take(size)
        spec = None if lay is None else next((f for f in lay.tagged if f.tag == tag), None)
        if spec is None:
            continue  # a tag this version does not know: skipped, as Kafka does
        sub = _Reader(data)
        out[spec.name] = _read_field(sub, spec, True)
        if sub.pos != len(data):
            raise _Corrupt(f"tagged field {tag} has {len(data) - sub.pos} bytes left over")


# --- writing ---------------------------------------------------------------------------


def _uvarint(out: bytearray, n: int) -> None:
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _bad(f: FieldSpec, value: Any, why: str) -> KafkaCodecError:
    return KafkaCodecError(
        f"field {f.name!r} ({'[]' if f.array else ''}{f.kind}): {why}, got {value!r:.80}",
        ErrorCode.INVALID_REQUEST,
    )


#: ``bytes``/``records`` values this long or longer are parts of their own in
#: :func:`encode_response_parts` (shorter ones cost less to copy than a part does).
BY_REFERENCE = 64 * 1024


class _Parts(bytearray):
    """A frame being written by :func:`encode_response_parts`: the bytes since the last
    part, and ``parts``, what came before."""

    parts: list[bytes | bytearray | memoryview]


def _write_length(out: bytearray, n: int, compact: bool, wide: bool) -> None:
    if compact:
        _uvarint(out, n + 1)
    else:
        out += (_I32 if wide else _I16).pack(n)


def _write_value(out: bytearray, f: FieldSpec, v: Any, compact: bool) -> None:
    kind = f.kind
    s = _FIXED.get(kind)
    if s is not None:
        if kind == "float64":
            out += s.pack(float(v))
            return
        lo, hi = _RANGES[kind]
        if not isinstance(v, int) or not lo <= v <= hi:
            raise _bad(f, v, f"an integer in {lo}..{hi} is needed")
        out += s.pack(v)
    elif kind == "string":
        if v is None:
            if not f.nullable:
                raise _bad(f, v, "may not be null at this version")
            _write_length(out, -1, compact, wide=False)
            return
        data = v.encode()
        if len(data) > 0x7FFF:
            raise _bad(f, v, f"a string of at most 32,767 bytes is needed ({len(data):,})")
        _write_length(out, len(data), compact, wide=False)
        out += data
    elif kind == "bool":
        out.append(1 if v else 0)
    elif kind in ("bytes", "records"):
        if v is None:
            if not (f.nullable or kind == "records"):
                raise _bad(f, v, "may not be null at this version")
            _write_length(out, -1, compact, wide=True)
            return
        _write_length(out, len(v), compact, wide=True)
        if len(v) >= BY_REFERENCE and isinstance(out, _Parts):
            out.parts.append(bytearray(out))  # what precedes, then ``v`` itself, not copied
            out.parts.append(v)
            out.clear()
        else:
            out += v
    elif kind == "uuid":
        out += (v if isinstance(v, uuid.UUID) else uuid.UUID(str(v))).bytes
    else:
        assert f.struct is not None
        _write_struct(out, f.struct, v)


def _write_field(out: bytearray, f: FieldSpec, v: Any, compact: bool) -> None:
    if not f.array:
        if f.kind == "struct" and f.nullable:
            if v is None:
                out += _I8.pack(-1)
                return
            out += _I8.pack(1)
        _write_value(out, f, v, compact)
        return
    if v is None:
        if not f.nullable:
            raise _bad(f, v, "may not be null at this version")
        _write_length(out, -1, compact, wide=True)
        return
    _write_length(out, len(v), compact, wide=True)
    for item in v:
        _write_value(out, f, item, compact)


def _write_struct(out: bytearray, lay: Layout, body: dict[str, Any]) -> None:
    if not isinstance(body, dict):
        raise KafkaCodecError(
            f"a struct must be a dict, got {body!r:.80}", ErrorCode.INVALID_REQUEST
        )
    compact = lay.flexible
    for f in lay.fields:
        v = body[f.name] if f.name in body else f.fresh_default()
        _write_field(out, f, v, compact)
    if compact:
        tags: list[tuple[int, bytes]] = []
        for f in lay.tagged:
            if f.name not in body:
                continue
            v = body[f.name]
            if v == f.fresh_default():
                continue  # a tagged field at its default is not written
            one = bytearray()
            _write_field(one, f, v, True)
            tags.append((f.tag, bytes(one)))
        _uvarint(out, len(tags))
        for tag, data in tags:
            _uvarint(out, tag)
            _uvarint(out, len(data))
            out += data


# --- frames ----------------------------------------------------------------------------


def _corrupt(why: object, header: RequestHeader | None) -> KafkaCodecError:
    return KafkaCodecError(f"malformed request: {why}", ErrorCode.CORRUPT_MESSAGE, header)


def _view(frame: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(frame)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _header(r: _Reader) -> RequestHeader:
    if len(r.buf) < _HEAD.size:
        raise _Corrupt(f"a header needs {_HEAD.size} bytes, the frame has {len(r.buf)}")
    api_key, api_version, correlation_id = _HEAD.unpack_from(r.buf, 0)
    r.pos = _HEAD.size
    client_id = r.text(compact=False, nullable=True)
    return RequestHeader(api_key, api_version, correlation_id, client_id)


def decode_header(frame: bytes | bytearray | memoryview) -> RequestHeader:
    """The header of a request frame (the bytes after its size).

    Raises:
        KafkaCodecError: CORRUPT_MESSAGE when not even the header can be read.
    """
    try:
        return _header(_Reader(_view(frame)))
    except _Corrupt as exc:
        raise _corrupt(exc, None) from None


def decode_request(frame: bytes | bytearray | memoryview) -> tuple[RequestHeader, dict[str, Any]]:
    """A request frame (without its size) as its header and body.

    Byte fields and records are memoryviews of ``frame``.

    Raises:
        KafkaCodecError: UNSUPPORTED_VERSION for an API or version without a schema (its
            ``header`` set), CORRUPT_MESSAGE for anything else that cannot be read.
    """
    r = _Reader(_view(frame))
    header = None
    try:
        header = _header(r)
        lay = layout(header.api_key, "request", header.api_version)
        if lay is None:
            raise KafkaCodecError(
                f"API key {header.api_key} version {header.api_version} is not supported",
                ErrorCode.UNSUPPORTED_VERSION,
                header,
            )
        if lay.flexible:
            _read_tags(r, None, {})  # request header v2: its tagged fields (none defined)
        return header, _read_struct(r, lay)
    except _Corrupt as exc:
        raise _corrupt(exc, header) from None
    except RecursionError:
        raise _corrupt("nesting too deep", header) from None


def _response_flexible(api_key: int, version: int) -> bool:
    # ApiVersions answers with header v0 whatever its version, so that a client that asked
    # with a version the broker does not know can still read the answer (KIP-511).
    return api_key != API_VERSIONS_KEY and flexible(api_key, version)


def encode_response(
    header: RequestHeader, body: dict[str, Any], version: int | None = None
) -> bytes:
    """The response frame, size first, answering ``header`` with ``body``.

    ``version`` writes the body at another version than the request's: ApiVersions answers
    a version it does not support in the v0 layout (KIP-511).

    Raises:
        KafkaCodecError: INVALID_REQUEST when a value does not fit its field.
    """
    out = bytearray(4)
    _write_response(out, header, body, version)
    _I32.pack_into(out, 0, len(out) - 4)
    return bytes(out)


def encode_response_parts(
    header: RequestHeader, body: dict[str, Any], version: int | None = None
) -> list[bytes | bytearray | memoryview]:
    """:func:`encode_response`'s frame as consecutive parts, for a transport's
    ``writelines``: each ``bytes`` or ``records`` value of :data:`BY_REFERENCE` bytes or
    more is a part of its own, the caller's object itself, not copied (most of a Fetch
    answer is its records: copying them into one frame twice cost about as much CPU as
    reading them from the log). The values must not change until the parts are written.

    Raises:
        KafkaCodecError: what :func:`encode_response` raises.
    """
    out = _Parts(4)
    out.parts = []
    _write_response(out, header, body, version)
    parts = out.parts
    parts.append(out)
    first = parts[0]
    assert isinstance(first, bytearray)
    _I32.pack_into(first, 0, sum(len(p) for p in parts) - 4)
    return parts


def _write_response(
    out: bytearray, header: RequestHeader, body: dict[str, Any], version: int | None
) -> None:
    v = header.api_version if version is None else version
    lay = layout(header.api_key, "response", v)
    if lay is None:
        raise KafkaCodecError(
            f"no response schema for API key {header.api_key} version {v}",
            ErrorCode.UNSUPPORTED_VERSION,
            header,
        )
    out += _I32.pack(header.correlation_id)
    if _response_flexible(header.api_key, v):
        out.append(0)  # response header v1: no tagged fields
    _write_struct(out, lay, body)


def encode_request(header: RequestHeader, body: dict[str, Any]) -> bytes:
    """A request frame, size first (clients and tests).

    Raises:
        KafkaCodecError: an API or version without a schema, or a value that does not fit.
    """
    lay = layout(header.api_key, "request", header.api_version)
    if lay is None:
        raise KafkaCodecError(
            f"API key {header.api_key} version {header.api_version} is not supported",
            ErrorCode.UNSUPPORTED_VERSION,
            header,
        )
    out = bytearray(4)
    out += _HEAD.pack(header.api_key, header.api_version, header.correlation_id)
    cid = header.client_id
    if cid is None:
        out += _I16.pack(-1)
    else:
        data = cid.encode()
        out += _I16.pack(len(data))
        out += data
    if lay.flexible:
        out.append(0)
    _write_struct(out, lay, body)
    _I32.pack_into(out, 0, len(out) - 4)
    return bytes(out)


def decode_response(
    api_key: int, api_version: int, frame: bytes | bytearray | memoryview
) -> tuple[int, dict[str, Any]]:
    """A response frame (without its size) as its correlation id and body (clients, tests).

    Raises:
        KafkaCodecError: as :func:`decode_request`.
    """
    lay = layout(api_key, "response", api_version)
    if lay is None:
        raise KafkaCodecError(
            f"API key {api_key} version {api_version} is not supported",
            ErrorCode.UNSUPPORTED_VERSION,
        )
    r = _Reader(_view(frame))
    try:
        correlation_id = r.fixed(_I32)
        if _response_flexible(api_key, api_version):
            _read_tags(r, None, {})
        return correlation_id, _read_struct(r, lay)
    except _Corrupt as exc:
        raise _corrupt(exc, None) from None
