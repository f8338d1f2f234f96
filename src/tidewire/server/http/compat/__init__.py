"""Compatibility modes: the HTTP APIs of other message buses, served on ports of their own
(``http_msgbus_port``, ``http_ipubsub_port``) so their clients work unchanged against tidewire.

msgbus maps its topics onto tidewire topics of one partition under the prefix ``msgbus.``
(:func:`topic_for` escapes any name into a valid topic name), and its "receive once" semantics
onto a consumer group whose committed offset advances as messages are taken (:mod:`._pop`).
iPubSub's streams are tidewire's lightweight streams of the same ids (``broker.streams``). See
docs/http-compat.md for what is and is not compatible.
"""

from __future__ import annotations

import contextlib
import datetime as _dt

from tidewire.broker import Broker
from tidewire.errors import InvalidTopicError, TopicExistsError
from tidewire.storage.manager import MAX_TOPIC_NAME

__all__ = ["ensure_topic", "name_of", "rfc3339", "topic_for"]

_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-")


def topic_for(prefix: str, name: str) -> str:
    """The tidewire topic of a foreign topic or stream name: ``prefix`` and the name with every
    byte other than ASCII letters, digits, ``.`` and ``-`` written ``_HH`` (its UTF-8 bytes in
    hex), so that any name maps to one valid topic and back (:func:`name_of`).

    Raises:
        InvalidTopicError: the name is empty or its topic would exceed the topic name limit.
    """
    if not name:
        raise InvalidTopicError("the name is empty")
    out = [prefix]
    for ch in name:
        if ch in _PLAIN:
            out.append(ch)
        else:
            out.extend(f"_{b:02x}" for b in ch.encode())
    topic = "".join(out)
    if len(topic) > MAX_TOPIC_NAME or topic in (".", ".."):
        raise InvalidTopicError(
            f"name {name[:40]!r} maps to a topic of {len(topic)} characters; the limit is "
            f"{MAX_TOPIC_NAME}"
        )
    return topic


def name_of(prefix: str, topic: str) -> str | None:
    """The foreign name of a tidewire topic made by :func:`topic_for` (``None`` for a topic
    outside ``prefix``, or not one it makes)."""
    if not topic.startswith(prefix):
        return None
    rest = topic[len(prefix) :]
    raw = bytearray()
    i = 0
    while i < len(rest):
        if rest[i] == "_":
            hex_ = rest[i + 1 : i + 3]
            if len(hex_) != 2 or not all(c in "0123456789abcdef" for c in hex_):
                return None
            raw.append(int(hex_, 16))
            i += 3
        else:
            raw += rest[i].encode()
            i += 1
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return None


def rfc3339(ms: int) -> str:
    """A timestamp (ms since the epoch) as RFC 3339 in UTC with milliseconds."""
    t = _dt.datetime.fromtimestamp(ms / 1000, tz=_dt.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def ensure_topic(broker: Broker, topic: str, batch: bytes | None = None) -> None:
    """Create ``topic`` with one partition unless it exists (a compatibility mode creates
    its topics on first use, whatever the broker's auto-creation setting).

    Args:
        batch: the record batch a publish is about to store: checked against the limit the
            new topic will have before the topic is created, so that a refused publish
            creates nothing (as the native API's first publish).

    Raises:
        BatchTooLargeError: ``batch`` exceeds the new topic's ``max_batch_bytes``.
        InvalidTopicError: the name is not allowed.
    """
    if (topic, 0) in broker.logs.logs:
        return
    if batch is not None:
        broker.check_first_publish(batch)
    with contextlib.suppress(TopicExistsError):
        broker.create_topic(topic, 1)
