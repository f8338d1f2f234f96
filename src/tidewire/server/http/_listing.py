"""Server-side paging, filtering and sorting of the list routes (``GET /v1/topics``,
``GET /v1/groups``): a page of ``limit`` items from ``offset`` of the names that contain
``q``, sorted by one key, with the total and the offset of the next page.

A page of thousands of names costs one pass over the names (the filter) and one sort; the
per-item figures (sizes, lags) are computed for the page alone unless the sort needs them
for every item that matched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Annotated, Any, TypeVar

from fastapi import Query

__all__ = [
    "DEFAULT_PAGE",
    "MAX_PAGE",
    "LimitParam",
    "OffsetParam",
    "QueryParam",
    "paged",
]

#: Items per page by default: as many as the largest page, so a client that does not page
#: gets whole lists up to it (``next`` says when there is more).
DEFAULT_PAGE = 1000
#: The largest page: bounds the work and the answer of one request (a list of 1,000 items
#: with their figures is about 100 KB of JSON).
MAX_PAGE = 1000

T = TypeVar("T")

LimitParam = Annotated[
    int, Query(ge=1, le=MAX_PAGE, description=f"Items per page (1..{MAX_PAGE:,}).")
]
OffsetParam = Annotated[
    int,
    Query(ge=0, le=2**31 - 1, description="Items to skip: 0, or the `next` of the last page."),
]
QueryParam = Annotated[
    str,
    Query(max_length=255, description="Only names that contain this text (case-insensitive)."),
]


def matching(names: Iterable[str], q: str) -> list[str]:
    """The ``names`` containing ``q``, case-insensitively (all for an empty ``q``)."""
    if not q:
        return list(names)
    low = q.lower()
    return [n for n in names if low in n.lower()]


def paged(
    names: list[str],
    *,
    sort: str,
    keys: dict[str, Callable[[str], Any]],
    offset: int,
    limit: int,
) -> tuple[list[str], int, int | None]:
    """The page of ``names``: sorted by ``sort`` (a key of ``keys``, ``-`` in front for
    descending; ties by name), then ``limit`` from ``offset``.

    Returns:
        (the page's names, how many names there are, the next page's offset or None).
    """
    descending = sort.startswith("-")
    key = keys[sort.removeprefix("-")]
    ordered = sorted(names)  # ties: by name, ascending
    if sort.removeprefix("-") != "name" or descending:
        ordered.sort(key=key, reverse=descending)
    page = ordered[offset : offset + limit]
    end = offset + len(page)
    return page, len(ordered), (end if end < len(ordered) else None)
