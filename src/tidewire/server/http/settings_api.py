"""``GET /v1/settings``: the settings in effect, each with where it came from.

Every setting of ``tidewire serve`` (``config.py``'s table, every section) with its value,
its default and its origin: the default, the file (``FILE [section] key``), an environment
variable, a flag, or the program that embeds the broker. Secrets are never shown: a setting
whose name says it holds one (a password, a secret, a token) answers ``"<redacted>"``; paths
to key files are not secrets and are shown.
"""

from __future__ import annotations

import re

from fastapi import APIRouter
from pydantic import BaseModel, Field
from starlette.responses import Response

from tidewire.server.http._common import json_response, responses
from tidewire.server.http.context import GatewayContext
from tidewire.server.runtime import runtime_of

__all__ = ["REDACTED", "SettingDoc", "SettingsDoc", "settings_router"]

#: What a secret setting answers instead of its value.
REDACTED = "<redacted>"
#: Setting names that hold secrets (a ``*_file`` setting holds a path, not the secret).
_SECRET = re.compile(r"(password|secret|token|passphrase)(?!.*_file$)")

Scalar = str | int | float | bool | None


class SettingDoc(BaseModel):
    section: str = Field(description="Its table in the configuration file.")
    key: str
    value: Scalar = Field(description="In effect ('<redacted>' for a secret).")
    default: Scalar
    origin: str = Field(
        description="default, 'FILE [section] key', 'environment variable TIDEWIRE_KEY', "
        "'flag --key', or 'program (EmbeddedBroker)' for a broker embedded in a program."
    )
    env: str = Field(description="Its environment variable.")
    flag: str = Field(description="Its flag of tidewire serve.")
    help: str


class SettingsDoc(BaseModel):
    recorded: bool = Field(
        description="Whether the broker recorded its settings (false for a broker started "
        "neither by tidewire serve nor embedded: then settings is empty)."
    )
    settings: list[SettingDoc]
    warnings: list[str] = Field(description="Deprecated names in use, and what to write.")


def _plain(value: object) -> Scalar:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)  # an enum (fsync)


def settings_router(ctx: GatewayContext) -> APIRouter:
    """The settings in effect."""
    router = APIRouter(prefix="/v1/settings", tags=["settings"])

    @router.get("", response_model=SettingsDoc, responses=responses())
    async def get_settings() -> Response:
        """Every setting in effect with its default and where it came from (needs describe
        on the cluster); secrets redacted."""
        from tidewire.config import SETTINGS  # noqa: PLC0415 (config imports the server)

        settings = runtime_of(ctx.broker).settings
        if settings is None:
            return json_response({"recorded": False, "settings": [], "warnings": []})
        items = []
        for s in SETTINGS:
            secret = _SECRET.search(s.key) is not None
            items.append(
                {
                    "section": s.section,
                    "key": s.key,
                    "value": REDACTED if secret else _plain(settings.value(s.key)),
                    "default": REDACTED if secret else _plain(s.default),
                    "origin": settings.origins.get(s.key, "default"),
                    "env": s.env,
                    "flag": s.flag,
                    "help": s.help,
                }
            )
        return json_response(
            {"recorded": True, "settings": items, "warnings": list(settings.warnings)}
        )

    return router
