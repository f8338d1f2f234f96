"""The HTTP gateway: the native REST API (``/v1``, health, ``/openapi.json``, ``/docs``) and
the compatibility modes, served by uvicorn in the broker's event loop.

Public names (the app and the gateway import FastAPI and uvicorn, so they are imported from
their modules, and only a broker that serves HTTP pays for them)::

    HttpConfig                                   (tidewire.server.http)
    create_app, routers                          (tidewire.server.http.app)
    HttpGateway                                  (tidewire.server.http.gateway)
"""

from __future__ import annotations

import tidewire.server.http._paths  # noqa: F401  (before any route is compiled)
from tidewire.server.http.config import HttpConfig

__all__ = ["HttpConfig"]
