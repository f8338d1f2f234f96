"""``/dashboard``: the operations console, static files served from the package.

The dashboard is plain HTML, CSS and JavaScript modules (no framework, no build step, nothing
from another site) in ``server/http/dashboard/``. Its files are public: every figure it shows
comes through the API, which checks the permissions of the session or key behind each call.
Each answer carries a strict Content-Security-Policy (only this origin's scripts, styles,
images and connections; no inline script; no framing), so a message value rendered on a page
can never run as code there.

The files are read once, when the router is built: an answer is a dictionary lookup, and a
name that is not one of them (``..`` included) is a 404. On a node of a cluster the page names
the node in its ``tidewire-cluster`` meta tag (:data:`CLUSTER_META`), which is how the page
knows to list its Cluster page without asking ``/v1/cluster`` (a 404 on a single node).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException
from starlette.responses import Response

from tidewire.cluster import cluster_node
from tidewire.server.http.context import GatewayContext

__all__ = [
    "CLUSTER_META",
    "CONTENT_SECURITY_POLICY",
    "DASHBOARD_DIR",
    "dashboard_files",
    "dashboard_router",
]

#: Where the dashboard's files are (inside the package, so the wheel carries them).
DASHBOARD_DIR = Path(__file__).parent / "dashboard"

#: Only this origin: scripts, styles, images and fetch/WebSocket connections ('self' covers
#: ws:/wss: of the same host); no plugins, no <base>, no framing by another page.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)

#: The meta tag of index.html that a cluster node fills with its node id.
CLUSTER_META = b'<meta name="tidewire-cluster" content="">'

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
}

_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    # The files change with the installed version only; revalidating is cheap and keeps an
    # upgraded broker from serving a stale mix of modules.
    "Cache-Control": "no-cache",
}


def dashboard_files(directory: Path = DASHBOARD_DIR) -> dict[str, tuple[bytes, str]]:
    """Every servable file of ``directory`` (not its subdirectories): name -> (bytes,
    content type)."""
    out: dict[str, tuple[bytes, str]] = {}
    for f in sorted(directory.iterdir()):
        ctype = _TYPES.get(f.suffix)
        if f.is_file() and ctype is not None:
            out[f.name] = (f.read_bytes(), ctype)
    return out


def dashboard_router(ctx: GatewayContext) -> APIRouter:
    """``GET /dashboard`` (the page) and ``GET /dashboard/{path}`` (its scripts and style)."""
    broker = ctx.broker
    router = APIRouter(tags=["dashboard"])
    files = dashboard_files()

    def answer(name: str) -> Response:
        got = files.get(name)
        if got is None:
            raise HTTPException(status_code=404)  # answered as "no route GET ..."
        body, ctype = got
        return Response(body, media_type=ctype, headers=_HEADERS)

    @router.get("/dashboard", response_class=Response)
    async def dashboard() -> Response:
        """The operations console (a web page; see docs/dashboard.md)."""
        node = cluster_node(broker)  # asked per request: a node joins after the app is made
        if node is None:
            return answer("index.html")
        body, ctype = files["index.html"]
        filled = CLUSTER_META.replace(b'""', f'"{node.node_id}"'.encode())
        return Response(body.replace(CLUSTER_META, filled), media_type=ctype, headers=_HEADERS)

    @router.get("/dashboard/{path}", response_class=Response, responses={404: {}})
    async def dashboard_file(path: str) -> Response:
        """A file of the console: its scripts and style sheet."""
        return answer(path)

    return router
