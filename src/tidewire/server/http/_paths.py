"""Path parameters that may hold any character.

Starlette's ``{name:path}`` matches ``.*``, which stops at a line break, so a stream id (any
string but NUL) or a topic name holding one could not be named in a URL: the request got
"no route" (404) instead of the route's own answer (a stream, or a 400 naming the bad topic
name). The ``path`` convertor is replaced, before any route is compiled, by one whose regex
also matches line breaks; the routes and the gate's route table (auth.py) both compile
their templates through it.
"""

from __future__ import annotations

from starlette.convertors import CONVERTOR_TYPES, PathConvertor

__all__ = ["AnyPathConvertor"]


class AnyPathConvertor(PathConvertor):
    """``{name:path}``: any characters, line breaks and '/' included."""

    regex = r"[\s\S]*"


CONVERTOR_TYPES["path"] = AnyPathConvertor()
