"""The CLI and configuration references in docs/ cover every setting and command."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidewire.config import SETTINGS, Setting

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.key)
def test_configuration_md_has_every_setting(setting: Setting) -> None:
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    row = next(
        (line for line in text.splitlines() if line.startswith(f"| `{setting.key}` |")), None
    )
    assert row is not None, f"no row for {setting.key}"
    assert f"`{setting.env}`" in row
    assert f"`{setting.flag}`" in row


@pytest.mark.parametrize(
    "command",
    [
        "tidewire serve",
        "tidewire config init",
        "tidewire config show",
        "tidewire topic create",
        "tidewire topic list",
        "tidewire topic describe",
        "tidewire topic alter",
        "tidewire topic delete",
        "tidewire topic repair",
        "tidewire publish",
        "tidewire consume",
        "tidewire exchange declare",
        "tidewire exchange list",
        "tidewire queue declare",
        "tidewire queue describe",
        "tidewire bind",
        "tidewire dlq list",
        "tidewire dlq replay",
        "tidewire dlq purge",
        "tidewire stream send",
        "tidewire stream receive",
        "tidewire stream read",
        "tidewire stream list",
        "tidewire stream describe",
        "tidewire health",
        "tidewire audit",
        "tidewire group list",
        "tidewire group describe",
        "tidewire group reset",
        "tidewire group delete",
        "tidewire export",
        "tidewire user create",
        "tidewire user list",
        "tidewire user describe",
        "tidewire user delete",
        "tidewire user roles",
        "tidewire key create",
        "tidewire key list",
        "tidewire key revoke",
        "tidewire acl add",
        "tidewire acl remove",
        "tidewire acl list",
        "tidewire quota set",
        "tidewire quota clear",
        "tidewire quota list",
        "tidewire certs init",
    ],
)
def test_cli_md_has_every_command(command: str) -> None:
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    assert f"$ {command} " in text
