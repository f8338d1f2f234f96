"""``tidewire metrics``: a readable summary of a broker's ``/metrics``."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections import defaultdict
from typing import Annotated, Any
from urllib.parse import urlsplit

import typer

from ._common import EXIT_ERROR, EXIT_USAGE, ApiKeyOption, JsonOption, echo_json, fail

__all__ = ["metrics"]

#: Where ``tidewire serve --http-port 8080`` answers.
DEFAULT_HTTP_URL = "http://127.0.0.1:8080"
#: Topics and groups listed in the text summary (``--json`` lists every one).
TOP = 10


def metrics(
    url: Annotated[
        str,
        typer.Option(
            "--http-url",
            "-u",
            envvar="TIDEWIRE_HTTP_URL",
            help="The broker's HTTP API (serve --http-port), e.g. http://127.0.0.1:8080.",
        ),
    ] = DEFAULT_HTTP_URL,
    api_key: ApiKeyOption = None,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.001, help="Give up after this long (s).")
    ] = 10.0,
    as_json: JsonOption = False,
) -> None:
    """Fetch the broker's ``/metrics`` and print a summary: version and uptime, messages and
    bytes in and out, connections and requests in flight, storage, the busiest topics and
    the consumer groups that lag most. With authentication on, give an API key of a
    principal allowed describe on the cluster (``--api-key`` or ``TIDEWIRE_API_KEY``).

    Exit code 0: fetched; 1: the broker did not answer or refused (the reason is printed).
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        fail(f"--http-url: {url!r} must be an http:// or https:// address", EXIT_USAGE)
    req = urllib.request.Request(url.rstrip("/") + "/metrics")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        exc.close()  # its socket
        try:
            message = json.loads(raw)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = raw[:200].decode("utf-8", "replace")
        fail(f"{url}/metrics answered {exc.code}: {message}", EXIT_ERROR)
    except (urllib.error.URLError, OSError) as exc:
        fail(f"{url}: {getattr(exc, 'reason', exc)}", EXIT_ERROR)
    summary = summarize(text)
    if as_json:
        echo_json(summary)
        return
    for line in render(summary):
        typer.echo(line)


def summarize(text: str) -> dict[str, Any]:
    """The figures of an exposition that the summary shows (every topic and group)."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    flat: dict[str, float] = {}
    by_label: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    version = ""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels:
                by_label[s.name].append((s.labels, s.value))
            else:
                flat[s.name] = s.value
            if s.name == "tidewire_broker_info":
                version = s.labels.get("version", "")
    topics: dict[str, dict[str, Any]] = {}
    for name, key in (
        ("tidewire_topic_messages_in_total", "messages_in"),
        ("tidewire_topic_bytes_in_total", "bytes_in"),
        ("tidewire_topic_messages_out_total", "messages_out"),
        ("tidewire_topic_bytes_out_total", "bytes_out"),
        ("tidewire_topic_size_bytes", "size_bytes"),
        ("tidewire_topic_partitions", "partitions"),
    ):
        for labels, v in by_label.get(name, []):
            topics.setdefault(labels["topic"], {"topic": labels["topic"]})[key] = int(v)
    groups: dict[str, dict[str, Any]] = {}
    for labels, v in by_label.get("tidewire_group_members", []):
        groups.setdefault(labels["group"], {"group": labels["group"]})["members"] = int(v)
    for labels, v in by_label.get("tidewire_group_state", []):
        if v:
            groups.setdefault(labels["group"], {"group": labels["group"]})["state"] = labels[
                "state"
            ]
    for labels, v in by_label.get("tidewire_group_lag_total_messages", []):
        groups.setdefault(labels["group"], {"group": labels["group"]})["lag"] = int(v)

    def labelled(name: str, **want: str) -> float:
        return sum(
            v
            for labels, v in by_label.get(name, [])
            if all(labels.get(k) == x for k, x in want.items())
        )

    requests = int(labelled("tidewire_request_duration_seconds_count"))
    errors = int(labelled("tidewire_request_errors_total"))
    return {
        "version": version,
        "uptime_s": flat.get("tidewire_uptime_seconds", 0.0),
        "messages_in": sum(t.get("messages_in", 0) for t in topics.values()),
        "bytes_in": sum(t.get("bytes_in", 0) for t in topics.values()),
        "messages_out": sum(t.get("messages_out", 0) for t in topics.values()),
        "bytes_out": sum(t.get("bytes_out", 0) for t in topics.values()),
        "connections_open": int(labelled("tidewire_connections_open")),
        "requests": requests,
        "request_errors": errors,
        "requests_in_flight": int(labelled("tidewire_requests_in_flight")),
        "fetch_waiters": int(flat.get("tidewire_fetch_waiters", 0)),
        "disk_used_bytes": sum(t.get("size_bytes", 0) for t in topics.values()),
        "disk_free_bytes": int(flat.get("tidewire_disk_free_bytes", 0)),
        "series_dropped": int(flat.get("tidewire_metrics_series_dropped", 0)),
        "topics": sorted(topics.values(), key=lambda t: (-t.get("messages_in", 0), t["topic"])),
        "groups": sorted(groups.values(), key=lambda g: (-g.get("lag", 0), g["group"])),
    }


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def render(s: dict[str, Any]) -> list[str]:
    """The text summary of :func:`summarize`'s figures."""
    lines = [
        f"tidewire {s['version']}, up {s['uptime_s']:,.0f} s",
        f"messages in {s['messages_in']:,} ({_bytes(s['bytes_in'])}), "
        f"out {s['messages_out']:,} ({_bytes(s['bytes_out'])})",
        f"connections {s['connections_open']:,}, requests {s['requests']:,} "
        f"({s['request_errors']:,} errors), in flight {s['requests_in_flight']:,}, "
        f"long-polls waiting {s['fetch_waiters']:,}",
        f"storage {_bytes(s['disk_used_bytes'])} used, {_bytes(s['disk_free_bytes'])} free",
    ]
    if s["series_dropped"]:
        lines.append(
            f"note: {s['series_dropped']:,} partitions have no series of their own "
            "(metrics_max_partition_series)"
        )
    if s["topics"]:
        lines.append("topics (most messages in first):")
        for t in s["topics"][:TOP]:
            lines.append(
                f"  {t['topic']}: {t.get('partitions', 0)} partitions, "
                f"in {t.get('messages_in', 0):,}, out {t.get('messages_out', 0):,}, "
                f"{_bytes(t.get('size_bytes', 0))}"
            )
        if len(s["topics"]) > TOP:
            lines.append(f"  ... and {len(s['topics']) - TOP:,} more")
    if s["groups"]:
        lines.append("consumer groups (largest lag first):")
        for g in s["groups"][:TOP]:
            lines.append(
                f"  {g['group']}: lag {g.get('lag', 0):,}, {g.get('members', 0)} members, "
                f"{g.get('state', '?')}"
            )
        if len(s["groups"]) > TOP:
            lines.append(f"  ... and {len(s['groups']) - TOP:,} more")
    return lines
