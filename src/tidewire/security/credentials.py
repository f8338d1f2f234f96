"""The credentials a client authenticates with: an API key and the SASL mechanism to use."""

from __future__ import annotations

from dataclasses import dataclass

from tidewire.security.keys import parse_key

__all__ = ["MECHANISMS", "Credentials"]

#: What a client may choose: SCRAM proves the key without sending it (safe without TLS);
#: PLAIN sends the key itself (the broker accepts it over TLS only, unless configured).
MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")


@dataclass(frozen=True, slots=True, repr=False)
class Credentials:
    """An API key (``twk_<id>_<secret>``, from ``tidewire key create``) and the SASL mechanism
    the client authenticates with. Its ``repr`` shows the key id only.

    Raises:
        AuthenticationFailedError: not an API key.
        ValueError: an unknown mechanism.
    """

    api_key: str
    mechanism: str = "SCRAM-SHA-256"

    def __post_init__(self) -> None:
        parse_key(self.api_key)
        if self.mechanism not in MECHANISMS:
            raise ValueError(
                f"SASL mechanism {self.mechanism!r} must be one of {', '.join(MECHANISMS)}"
            )

    @property
    def key_id(self) -> str:
        return parse_key(self.api_key)[0]

    @property
    def secret(self) -> str:
        return parse_key(self.api_key)[1]

    def __repr__(self) -> str:
        return f"Credentials(key id {self.key_id}, {self.mechanism})"
