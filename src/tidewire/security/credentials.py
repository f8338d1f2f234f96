"""What a client authenticates with: an API key and the SASL mechanism to present it by."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Credentials"]


@dataclass(frozen=True, slots=True)
class Credentials:
    """An API key (``twk_<id>_<secret>``) and the mechanism: ``SCRAM-SHA-256`` (the
    default; the secret never crosses the wire), ``SCRAM-SHA-512`` or ``PLAIN``. Its repr
    names the key by its id alone."""

    api_key: str = field(repr=False)
    mechanism: str = "SCRAM-SHA-256"

    def __repr__(self) -> str:
        parts = self.api_key.split("_")
        key_id = parts[1] if len(parts) >= 3 and parts[0] == "twk" else "?"
        return f"Credentials(api_key=<key {key_id}>, mechanism={self.mechanism!r})"
