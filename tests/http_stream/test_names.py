"""The pure pieces: foreign names to topic names and back (any text, always a valid topic,
never two names on one topic), resume tokens, and ``from=`` parsing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidewire.errors import InvalidRequestError, InvalidTopicError
from tidewire.server.http._cursor import StartAt, decode_token, encode_token, parse_from
from tidewire.server.http.compat import name_of, topic_for
from tidewire.storage.manager import validate_topic_name


@given(st.text(min_size=1, max_size=40))
def test_any_name_maps_to_a_valid_topic_and_back(name: str) -> None:
    plain = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-")
    length = len("msgbus.") + sum(1 if c in plain else 3 * len(c.encode()) for c in name)
    try:
        topic = topic_for("msgbus.", name)
    except InvalidTopicError:
        assert length > 200  # refused only when it does not fit
        return
    assert len(topic) == length
    validate_topic_name(topic)
    assert name_of("msgbus.", topic) == name


@given(st.text(min_size=1, max_size=20), st.text(min_size=1, max_size=20))
def test_different_names_never_share_a_topic(a: str, b: str) -> None:
    if a != b:
        assert topic_for("ipubsub.", a) != topic_for("ipubsub.", b)


def test_names_that_do_not_fit_and_topics_of_others() -> None:
    assert topic_for("ipubsub.", "chat:room-1") == "ipubsub.chat_3aroom-1"
    with pytest.raises(InvalidTopicError):
        topic_for("msgbus.", "")
    with pytest.raises(InvalidTopicError, match="limit is 200"):
        topic_for("msgbus.", "ü" * 40)
    assert name_of("msgbus.", "orders") is None
    assert name_of("msgbus.", "msgbus.bad_zz") is None
    assert name_of("msgbus.", "msgbus.bad_+1") is None
    assert name_of("msgbus.", "msgbus.bad_4") is None


@given(st.dictionaries(st.integers(0, 10_000), st.integers(0, 2**62), max_size=50))
def test_tokens_round_trip(positions: dict[int, int]) -> None:
    token = encode_token("orders", sorted(positions.items()))
    assert token.isascii()
    assert "=" not in token
    assert decode_token(token, "orders") == positions


@pytest.mark.parametrize(
    ("token", "words"),
    [
        ("!!", "not a resume token"),
        (encode_token("other", [(0, 1)]), "of topic 'other'"),
        ("WzIsIm9yZGVycyIsW11d", "version 2"),  # [2,"orders",[]]
        ("WzEsIm9yZGVycyIsW1swLC0xXV1d", "partition 0 at offset -1"),  # [1,"orders",[[0,-1]]]
        ("x" * 600_000, "exceeds"),
    ],
)
def test_bad_tokens(token: str, words: str) -> None:
    with pytest.raises(InvalidRequestError, match=words):
        decode_token(token, "orders")


def test_from_values() -> None:
    assert parse_from(None) == StartAt("latest")
    assert parse_from("earliest") == StartAt("earliest")
    assert parse_from("offset:12") == StartAt("offset", 12)
    assert parse_from("12") == StartAt("offset", 12)
    assert parse_from("timestamp:1700000000000") == StartAt("timestamp", 1_700_000_000_000)
    for bad in ("-1", "offset:", "offset:x", "time:5", "latest:3", "١٢"):
        with pytest.raises(InvalidRequestError):
            parse_from(bad)
