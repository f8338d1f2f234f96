"""Helpers the native API's routers share: error documentation, JSON answers, body parsing."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
from fastapi import FastAPI
from pydantic import BaseModel, ValidationError
from starlette.responses import Response

from tidewire.errors import InvalidRequestError
from tidewire.server.http.models import ErrorBody

__all__ = ["add_body_schemas", "json_response", "parse_body", "request_body", "responses"]

M = TypeVar("M", bound=BaseModel)

_WHAT = {
    307: "In a cluster: another node leads the partition (or holds it, for a read); Location "
    "names the same request on its HTTP listener (docs/cluster.md).",
    400: "A malformed request: bad JSON, a missing field or one of the wrong type (named).",
    404: "No such topic, partition or group.",
    409: "It exists already, or the group's state does not allow it.",
    413: "The body exceeds http_max_body_bytes, or the message the topic's max_message_bytes.",
    416: "The offset is outside the partition's log.",
    422: "A topic name, partition count or group id that is not allowed; or an offset in a "
    "damaged range of the partition's log (code 32: damaged_range says where to go on).",
    503: "The broker is busy (backpressure) or its storage refused; retry after Retry-After. "
    "Or the partition is offline (code 37); in a cluster, its leader is not known now or too "
    "few replicas are in sync.",
}
#: Answers any route may give, from the checks in front of the app (guard.py, protocol.py).
_GUARD = {
    403: "A request from a web page of another origin (http_allowed_origins).",
    408: "The headers or the body came too slowly; the connection is closed.",
    421: "A Host that is not one of the broker's names (http_allowed_hosts).",
}
#: Answers of the routes that take a body, from the same checks.
_GUARD_BODY = {
    413: _WHAT[413],
    415: "A Content-Type other than application/json (none is taken as JSON).",
}

_encode = msgspec.json.Encoder().encode


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI documentation of the error answers a route may give (400 and 503 always)."""
    return {s: {"model": ErrorBody, "description": _WHAT[s]} for s in sorted({400, 503, *statuses})}


def json_response(doc: object, status: int = 200) -> Response:
    """``doc`` (dicts, lists, numbers, text) as a JSON answer, encoded by msgspec."""
    return Response(_encode(doc), status_code=status, media_type="application/json")


def parse_body(model: type[M], body: bytes) -> M:
    """Validate a JSON body as ``model``.

    Raises:
        InvalidRequestError: not JSON, or not the model; the message names the field.
    """
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise InvalidRequestError(_describe(exc)) from None


def _describe(exc: ValidationError) -> str:
    parts: list[str] = []
    errors = exc.errors(include_url=False)
    for err in errors[:5]:
        if err["type"] == "json_invalid":
            parts.append(f"the body is not valid JSON: {err['msg']}")
            continue
        loc = ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")  # a model's own check says it all
        parts.append(f"field {loc}: {msg}" if loc else f"the body: {msg}")
    if len(errors) > 5:
        parts.append(f"and {len(errors) - 5} more")
    return "; ".join(parts)


#: Models routes parse from the raw body themselves (for speed and one error shape); their
#: schemas are added to the OpenAPI spec's components.
_BODY_MODELS: dict[str, type[BaseModel]] = {}


def request_body(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI ``requestBody`` of a route that parses ``model`` with :func:`parse_body`
    (pass it as ``openapi_extra={"requestBody": request_body(Model)}``)."""
    _BODY_MODELS[model.__name__] = model
    return {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}
        },
    }


#: Answers of the gate on every route that is not public.
_GATE = {
    401: "No valid credentials: a missing, malformed, unknown, expired or revoked API key "
    "(authentication on).",
    403: "The principal lacks the permission this route needs (ACLs); nothing changed.",
    429: "Too many failed authentications from this address or for this principal.",
}


def add_body_schemas(app: FastAPI) -> None:
    """Make ``app``'s OpenAPI spec hold the schemas :func:`request_body` refers to."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        spec = generate()
        schemas = spec.setdefault("components", {}).setdefault("schemas", {})
        for name, model in _BODY_MODELS.items():
            doc = model.model_json_schema(
                ref_template="#/components/schemas/{model}", mode="validation"
            )
            for dname, ddoc in doc.pop("$defs", {}).items():
                schemas.setdefault(dname, ddoc)
            schemas[name] = doc
        # Validation failures are answered 400 in the error shape, not FastAPI's 422.
        error = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
        # The gate (server/http/auth.py): Bearer API keys on every route not declared public.
        spec["components"].setdefault("securitySchemes", {})["bearerAuth"] = {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key (twk_...) from `tidewire key create`; required when "
            "the broker runs with authentication on (docs/security.md).",
        }
        spec["components"]["securitySchemes"]["sessionCookie"] = {
            "type": "apiKey",
            "in": "cookie",
            "name": "tidewire_session",
            "description": "A browser session from POST /v1/session; its POST, PUT, PATCH and "
            "DELETE requests also need the header X-CSRF-Token (docs/http.md).",
        }
        from tidewire.server.http.auth import ROUTE_NEEDS  # noqa: PLC0415 (imports this module)
        from tidewire.server.needs import PUBLIC  # noqa: PLC0415

        routes = ROUTE_NEEDS["native"]
        for path, ops in spec.get("paths", {}).items():
            for method, op in ops.items():
                route = routes.get((method.upper(), path))
                if route is None or route.requirement is not PUBLIC:
                    op["security"] = [{"bearerAuth": []}, {"sessionCookie": []}]
                    answers = op.setdefault("responses", {})
                    for status, what in _GATE.items():
                        answers.setdefault(str(status), {"description": what, "content": error})
        for ops in spec.get("paths", {}).values():
            for op in ops.values():
                answers = op.setdefault("responses", {})
                extra = _GUARD | (_GUARD_BODY if "requestBody" in op else {})
                for status, what in extra.items():
                    answers.setdefault(str(status), {"description": what, "content": error})
                answer = op.get("responses", {}).get("422", {})
                if "HTTPValidationError" in str(answer):
                    del op["responses"]["422"]
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        app.openapi_schema = spec
        return spec

    app.openapi = openapi  # type: ignore[method-assign]
