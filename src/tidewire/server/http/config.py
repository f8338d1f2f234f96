"""The HTTP gateway's settings (the ``[http]`` table of ``tidewire serve``'s configuration)."""

from __future__ import annotations

from dataclasses import dataclass

from tidewire.errors import InvalidConfigError

__all__ = ["DEFAULT_MAX_BODY_BYTES", "OFF", "HttpConfig"]

#: The port value that leaves a listener off.
OFF = -1
#: The largest request body accepted by default: a message of the default ``max_batch_bytes``
#: (16 MiB) sent as base64 grows by a third, to 21.3 MiB, plus its JSON; 32 MiB holds it,
#: and bounds what one request may make the broker buffer.
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024


def _port_ok(port: int) -> bool:
    return port == OFF or 0 <= port <= 65535


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """Settings of the HTTP gateway, validated on construction.

    Attributes:
        http_host: the address every HTTP listener binds.
        http_port: port of the native API (``/v1``, ``/healthz``, ``/openapi.json``, ``/docs``);
            ``-1``: no HTTP listener, ``0``: any free port.
        http_max_body_bytes: the longest request body accepted (413 beyond it).
        http_msgbus_port: port of the msgbus-compatible API; ``-1``: off, ``0``: any free.
        http_ipubsub_port: port of the iPubSub-compatible API; ``-1``: off, ``0``: any free.

    Raises:
        InvalidConfigError: a value out of its range.
    """

    http_host: str = "127.0.0.1"
    http_port: int = OFF
    http_max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    http_msgbus_port: int = OFF
    http_ipubsub_port: int = OFF

    def __post_init__(self) -> None:
        if not self.http_host:
            raise InvalidConfigError("http_host must not be empty")
        for name in ("http_port", "http_msgbus_port", "http_ipubsub_port"):
            value = getattr(self, name)
            if not _port_ok(value):
                raise InvalidConfigError(
                    f"{name}={value} must be within 0..65535 (0: any free port) or -1 (off)"
                )
        # Below 1 KiB not even a small JSON publish fits; above 1 GiB one request could
        # take the broker's memory.
        if not 1024 <= self.http_max_body_bytes <= 1024**3:
            raise InvalidConfigError(
                f"http_max_body_bytes={self.http_max_body_bytes:,} must be within "
                "1,024..1,073,741,824"
            )

    @property
    def enabled(self) -> bool:
        """Whether any HTTP listener is configured."""
        ports = (self.http_port, self.http_msgbus_port, self.http_ipubsub_port)
        return any(p != OFF for p in ports)
