"""Routing: the topic matcher against an independent reference (hypothesis) and RabbitMQ's
examples; headers matching; the router's exchanges, bindings, default and alternate
exchanges, and its indexes kept right as bindings come and go."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewire.broker.queues.model import Binding, ExchangeSpec
from tidewire.broker.queues.routing import (
    MATCH_MODES,
    MAX_KEY_BYTES,
    TOPIC_CACHE_SIZE,
    Route,
    Router,
    headers_match,
    topic_matches,
)
from tidewire.errors import InvalidQueueError, PreconditionFailedError, UnknownExchangeError

# --- topic_matches ---------------------------------------------------------------------------


def reference(pattern: list[str], key: list[str]) -> bool:
    """The definition, recursively over word lists."""
    if not pattern:
        return not key
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return any(reference(rest, key[i:]) for i in range(len(key) + 1))
    if not key:
        return False
    return (head == "*" or head == key[0]) and reference(rest, key[1:])


def words(s: str) -> list[str]:
    return s.split(".") if s else []


WORD = st.sampled_from(["a", "b", "c", "", "ab", "a*", "#x"])
PATTERN_WORD = st.one_of(WORD, st.just("*"), st.just("#"))


@settings(max_examples=1000, deadline=None)
@given(st.lists(PATTERN_WORD, max_size=7), st.lists(WORD, max_size=7))
def test_topic_matches_the_reference(pattern: list[str], key: list[str]) -> None:
    p, k = ".".join(pattern), ".".join(key)
    # "".join of [""] is "", which is zero words, not one empty word: compare the parsed ones.
    assert topic_matches(p, k) == reference(words(p), words(k))


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="ab.*#", max_size=12), st.text(alphabet="ab.*#", max_size=12))
def test_topic_matches_the_reference_on_raw_text(pattern: str, key: str) -> None:
    assert topic_matches(pattern, key) == reference(words(pattern), words(key))


@pytest.mark.parametrize(
    ("pattern", "key", "expected"),
    [
        # RabbitMQ's tutorial 5
        ("*.orange.*", "quick.orange.rabbit", True),
        ("*.*.rabbit", "quick.orange.rabbit", True),
        ("lazy.#", "lazy.orange.elephant", True),
        ("*.orange.*", "quick.orange.fox", True),
        ("*.*.rabbit", "lazy.brown.fox", False),
        ("lazy.#", "lazy.brown.fox", True),
        ("lazy.#", "lazy.pink.rabbit", True),
        ("*.orange.*", "quick.brown.fox", False),
        ("*.orange.*", "orange", False),
        ("*.orange.*", "quick.orange.new.rabbit", False),
        ("lazy.#", "lazy.orange.new.rabbit", True),
        ("lazy.#", "lazy", True),
        # '#' alone, and the empty key (zero words)
        ("#", "", True),
        ("#", "a", True),
        ("#", "a.b.c", True),
        ("#", ".", True),
        ("", "", True),
        ("", "a", False),
        ("*", "", False),
        ("*", "a", True),
        ("*", "a.b", False),
        # empty words are words
        ("*", ".", False),
        ("*.*", ".", True),
        ("a.*", "a.", True),
        ("a..b", "a..b", True),
        ("a.*.b", "a..b", True),
        ("a.#.b", "a.b", True),
        ("a.#.b", "a.x.b", True),
        ("a.#.b", "a.x.y.b", True),
        ("a.#.b", "a.x.y", False),
        ("a.#.b", "b.a.b", False),
        ("#.a", "a", True),
        ("#.a", "x.a", True),
        ("#.a", "a.x", False),
        ("a.#", "a", True),
        ("#.#", "", True),
        ("#.*", "", False),
        ("#.*", "a.b", True),
        ("*.#.*", "a", False),
        ("*.#.*", "a.b", True),
        ("#.b.#", "a.b.c", True),
        ("#.b.#", "a.c", False),
        # wildcards inside a word are literal
        ("a*", "ab", False),
        ("a*", "a*", True),
        ("#a", "a", False),
        # case matters
        ("A", "a", False),
    ],
)
def test_rabbitmq_examples(pattern: str, key: str, expected: bool) -> None:
    assert topic_matches(pattern, key) is expected
    assert reference(words(pattern), words(key)) is expected


# --- headers_match ---------------------------------------------------------------------------


def test_headers_all_and_any() -> None:
    args = (("format", "pdf"), ("type", "report"))
    assert headers_match(args, {"format": "pdf", "type": "report", "more": "x"})
    assert not headers_match(args, {"format": "pdf"})
    assert not headers_match(args, {"format": "pdf", "type": "log"})
    assert headers_match((("x-match", "all"), *args), {"format": "pdf", "type": "report"})
    anyargs = (("x-match", "any"), *args)
    assert headers_match(anyargs, {"type": "report"})
    assert headers_match(anyargs, {"format": "pdf", "type": "log"})
    assert not headers_match(anyargs, {"format": "zip", "type": "log"})
    assert not headers_match(anyargs, {})


def test_headers_edge_cases() -> None:
    # All of nothing is true, any of nothing is false (RabbitMQ).
    assert headers_match((), {})
    assert headers_match((("x-match", "all"),), {"a": "1"})
    assert not headers_match((("x-match", "any"),), {"a": "1"})
    # Values compare exactly; a missing header does not equal anything.
    assert not headers_match((("a", ""),), {})
    assert headers_match((("a", ""),), {"a": ""})
    assert not headers_match((("a", "1"),), {"a": "01"})


def test_x_arguments_are_ignored_unless_with_x() -> None:
    args = (("x-match", "all"), ("x-tenant", "blue"), ("kind", "k"))
    assert headers_match(args, {"kind": "k"})
    with_x = (("x-match", "all-with-x"), ("x-tenant", "blue"), ("kind", "k"))
    assert not headers_match(with_x, {"kind": "k"})
    assert headers_match(with_x, {"kind": "k", "x-tenant": "blue"})
    only_x = (("x-match", "any"), ("x-tenant", "blue"))
    assert not headers_match(only_x, {"x-tenant": "blue"})
    assert headers_match((("x-match", "any-with-x"), ("x-tenant", "blue")), {"x-tenant": "blue"})


def test_bad_x_match() -> None:
    with pytest.raises(InvalidQueueError, match=r"x-match='some'.*all, any, all-with-x"):
        headers_match((("x-match", "some"),), {})


# --- Router ----------------------------------------------------------------------------------


def make(queues: set[str] | None = None) -> Router:
    existing = queues if queues is not None else set()
    return Router(existing.__contains__)


def q(exchange: str, queue: str, key: str = "", **kw: object) -> Binding:
    return Binding(exchange, queue, "queue", key, **kw)  # type: ignore[arg-type]


def test_builtin_exchanges() -> None:
    r = make()
    assert {n: s.type for n, s in r.exchanges.items()} == {
        "": "direct",
        "amq.direct": "direct",
        "amq.fanout": "fanout",
        "amq.topic": "topic",
        "amq.headers": "headers",
    }
    assert all(s.durable for s in r.exchanges.values())
    for name in r.exchanges:
        with pytest.raises(InvalidQueueError, match="built in"):
            r.remove_exchange(name)
    r.add_exchange(ExchangeSpec("amq.topic", "topic"))  # equal: fine
    with pytest.raises(InvalidQueueError, match="built in"):
        r.add_exchange(ExchangeSpec("amq.topic", "fanout"))
    with pytest.raises(InvalidQueueError, match="reserved"):
        r.add_exchange(ExchangeSpec("amq.mine", "topic"))
    with pytest.raises(TypeError):
        r.exchanges["x"] = ExchangeSpec("x")  # type: ignore[index]


def test_default_exchange() -> None:
    queues = {"jobs"}
    r = make(queues)
    assert r.route("", "jobs", {}) == Route(("jobs",))
    assert r.route("", "other", {}) == Route()
    assert not r.route("", "other", {})
    queues.add("other")
    assert r.route("", "other", {}) == Route(("other",))
    with pytest.raises(InvalidQueueError, match="default exchange"):
        r.add_binding(q("", "jobs", "jobs"))
    assert r.remove_binding(q("", "jobs", "jobs")) is False
    assert r.bindings() == []


def test_declare_checks() -> None:
    r = make()
    with pytest.raises(InvalidQueueError, match="type 'x-delayed' must be one of direct, fan"):
        r.add_exchange(ExchangeSpec("e", "x-delayed"))
    with pytest.raises(InvalidQueueError, match="1 to 200 characters"):
        r.add_exchange(ExchangeSpec("bad name"))
    with pytest.raises(InvalidQueueError, match="alternate exchange name 'a b'"):
        r.add_exchange(ExchangeSpec("e", alternate_exchange="a b"))
    r.add_exchange(ExchangeSpec("e", "topic"))
    r.add_exchange(ExchangeSpec("e", "topic"))
    with pytest.raises(PreconditionFailedError, match=r"exists with type=topic.*type=direct"):
        r.add_exchange(ExchangeSpec("e", "direct"))
    assert "e" in r.exchanges
    with pytest.raises(UnknownExchangeError, match="no exchange 'nope'"):
        r.remove_exchange("nope")
    with pytest.raises(UnknownExchangeError, match="'nope'"):
        r.route("nope", "k", {})
    with pytest.raises(UnknownExchangeError):
        r.add_binding(q("nope", "q"))


def test_binding_checks() -> None:
    r = make()
    r.add_exchange(ExchangeSpec("h", "headers"))
    with pytest.raises(InvalidQueueError, match="x-match='one'"):
        r.add_binding(q("h", "q", arguments=(("x-match", "one"),)))
    with pytest.raises(InvalidQueueError, match="'a' given more than once"):
        r.add_binding(q("h", "q", arguments=(("a", "1"), ("a", "2"))))
    with pytest.raises(InvalidQueueError, match="name must not be empty"):
        r.add_binding(q("h", "q", arguments=(("", "1"),)))
    with pytest.raises(InvalidQueueError, match="kind 'stream' must be queue or topic"):
        r.add_binding(Binding("amq.direct", "q", "stream"))  # type: ignore[arg-type]
    with pytest.raises(InvalidQueueError, match="queue name"):
        r.add_binding(q("amq.direct", ""))
    with pytest.raises(InvalidQueueError, match=f"256 bytes exceeds the limit of {MAX_KEY_BYTES}"):
        r.add_binding(q("amq.direct", "q", "k" * 256))
    assert r.add_binding(q("amq.direct", "q", "k" * 255))
    assert r.bindings() == [q("amq.direct", "q", "k" * 255)]


def test_direct() -> None:
    r = make()
    assert r.add_binding(q("amq.direct", "a", "red"))
    assert not r.add_binding(q("amq.direct", "a", "red"))
    assert r.add_binding(q("amq.direct", "b", "red"))
    assert r.add_binding(q("amq.direct", "b", "green"))
    assert r.add_binding(Binding("amq.direct", "events", "topic", "red"))
    assert r.route("amq.direct", "red", {}) == Route(("a", "b"), ("events",))
    assert r.route("amq.direct", "green", {}) == Route(("b",))
    assert r.route("amq.direct", "blue", {}) == Route()
    assert r.remove_binding(q("amq.direct", "a", "red"))
    assert not r.remove_binding(q("amq.direct", "a", "red"))
    assert r.route("amq.direct", "red", {}) == Route(("b",), ("events",))
    r.remove_binding(q("amq.direct", "b", "red"))
    r.remove_binding(Binding("amq.direct", "events", "topic", "red"))
    assert r.route("amq.direct", "red", {}) == Route()
    assert r.has_bindings("amq.direct")
    r.remove_binding(q("amq.direct", "b", "green"))
    assert not r.has_bindings("amq.direct")


def test_fanout_deduplicates() -> None:
    r = make()
    r.add_exchange(ExchangeSpec("f", "fanout", durable=False))
    r.add_binding(q("f", "b", "x"))
    assert r.route("f", "anything", {}) == Route(("b",))
    r.add_binding(q("f", "a", "y"))
    r.add_binding(q("f", "a", "z"))  # another binding to the same queue: delivered once
    assert r.route("f", "", {}) == Route(("a", "b"))
    r.remove_binding(q("f", "a", "y"))
    assert r.route("f", "", {}) == Route(("a", "b"))
    r.remove_binding(q("f", "a", "z"))
    assert r.route("f", "", {}) == Route(("b",))


def test_topic_routes_like_the_matcher() -> None:
    patterns = ["#", "a.*", "a.#", "*.b", "a.#.b", "#.b.#", "", "*", "a..b", "a.b", "#.#"]
    keys = ["", "a", "b", "a.b", "a.x.b", "a..b", "x.b.y", "a.b.c", ".", "a."]
    r = make()
    for i, p in enumerate(patterns):
        r.add_binding(q("amq.topic", f"q{i}", p))
    r.add_binding(Binding("amq.topic", "log", "topic", "a.#"))

    def check() -> None:
        for key in keys:
            live = {(b.destination_kind, b.destination, b.key) for b in r.bindings()}
            want_q = sorted({d for k, d, p in live if k == "queue" and topic_matches(p, key)})
            want_t = sorted({d for k, d, p in live if k == "topic" and topic_matches(p, key)})
            assert r.route("amq.topic", key, {}) == Route(tuple(want_q), tuple(want_t)), key

    check()
    check()  # from the cache
    for i in (0, 4, 5, 2):  # removals prune the trie and forget the cache
        assert r.remove_binding(q("amq.topic", f"q{i}", patterns[i]))
        check()
    r.add_binding(q("amq.topic", "q0", "#"))
    check()
    assert r.remove_destination("topic", "log") == [Binding("amq.topic", "log", "topic", "a.#")]
    check()


def test_topic_cache_is_bounded() -> None:
    r = make()
    r.add_binding(q("amq.topic", "q", "*.even"))
    for i in range(TOPIC_CACHE_SIZE + 100):
        expected = Route(("q",)) if i % 2 == 0 else Route()
        key = f"{i}.{'even' if i % 2 == 0 else 'odd'}"
        assert r.route("amq.topic", key, {}) == expected
    ex = r._exchanges["amq.topic"]
    assert len(ex.cache) == TOPIC_CACHE_SIZE


def test_headers_exchange() -> None:
    r = make()
    r.add_binding(q("amq.headers", "pdf", arguments=(("format", "pdf"),)))
    r.add_binding(
        q("amq.headers", "reports", arguments=(("x-match", "any"), ("type", "report"), ("t", "r")))
    )
    r.add_binding(q("amq.headers", "all"))  # all of nothing: everything
    assert r.route("amq.headers", "", {"format": "pdf"}) == Route(("all", "pdf"))
    assert r.route("amq.headers", "", {"t": "r", "format": "zip"}) == Route(("all", "reports"))
    r.remove_binding(q("amq.headers", "all"))
    assert r.route("amq.headers", "", {}) == Route()


def test_alternate_exchange() -> None:
    r = make({"jobs"})
    r.add_exchange(ExchangeSpec("main", "direct", alternate_exchange="unrouted"))
    r.add_exchange(ExchangeSpec("unrouted", "fanout"))
    r.add_binding(q("main", "a", "k"))
    assert r.route("main", "k", {}) == Route(("a",))
    assert r.route("main", "other", {}) == Route()  # the alternate exchange has no binding
    r.add_binding(q("unrouted", "lost"))
    assert r.route("main", "other", {}) == Route(("lost",))
    assert r.route("main", "k", {}) == Route(("a",))  # matched: the alternate is not used
    # A chain: main -> second -> third
    r.add_exchange(ExchangeSpec("second", "topic", alternate_exchange="third"))
    r.add_exchange(ExchangeSpec("third", "fanout"))
    r.add_exchange(ExchangeSpec("m2", "direct", alternate_exchange="second"))
    r.add_binding(q("third", "last"))
    assert r.route("m2", "x", {}) == Route(("last",))
    r.add_binding(q("second", "t", "x.#"))
    assert r.route("m2", "x.y", {}) == Route(("t",))
    # An alternate exchange that does not exist (yet) routes nowhere.
    r.add_exchange(ExchangeSpec("m3", "direct", alternate_exchange="missing"))
    assert r.route("m3", "k", {}) == Route()
    r.add_exchange(ExchangeSpec("missing", "fanout"))
    r.add_binding(q("missing", "found"))
    assert r.route("m3", "k", {}) == Route(("found",))


def test_alternate_exchange_cycles_end() -> None:
    r = make()
    r.add_exchange(ExchangeSpec("a", "direct", alternate_exchange="b"))
    r.add_exchange(ExchangeSpec("b", "direct", alternate_exchange="c"))
    r.add_exchange(ExchangeSpec("c", "direct", alternate_exchange="a"))
    r.add_exchange(ExchangeSpec("self", "direct", alternate_exchange="self"))
    assert r.route("a", "k", {}) == Route()
    assert r.route("self", "k", {}) == Route()
    r.add_binding(q("c", "q", "k"))
    assert r.route("a", "k", {}) == Route(("q",))
    assert r.route("b", "k", {}) == Route(("q",))
    assert r.route("a", "j", {}) == Route()


def test_remove_exchange_and_destination() -> None:
    r = make()
    r.add_exchange(ExchangeSpec("x", "topic"))
    bx = [q("x", "q1", "a.*"), q("x", "q2", "#"), Binding("x", "t", "topic", "#")]
    for b in bx:
        r.add_binding(b)
    others = [q("amq.fanout", "q1"), q("amq.direct", "q1", "k")]
    for b in others:
        r.add_binding(b)
    assert r.bindings(exchange="x") == bx
    assert r.bindings(destination="q1") == [others[1], others[0], bx[0]]
    assert r.bindings(destination="q1", exchange="x") == [bx[0]]
    assert r.bindings(kind="topic") == [bx[2]]
    assert r.bindings(destination="t", kind="queue") == []
    assert r.bindings(exchange="nope") == []
    assert r.remove_exchange("x") == bx
    assert "x" not in r.exchanges
    assert r.bindings() == [others[1], others[0]]
    assert not r.has_bindings("x")
    assert r.bindings(destination="q2") == []
    assert r.remove_destination("queue", "q1") == [others[0], others[1]]
    assert r.bindings() == []
    assert r.remove_destination("queue", "q1") == []
    assert r.route("amq.fanout", "", {}) == Route()
    # Declared again: no binding comes back.
    r.add_exchange(ExchangeSpec("x", "topic"))
    assert r.route("x", "a.b", {}) == Route()


PATTERN = st.lists(PATTERN_WORD, max_size=5).map(".".join)
KEY = st.lists(WORD, max_size=5).map(".".join)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), st.sampled_from(["q1", "q2", "q3"]), PATTERN), max_size=25),
    st.lists(KEY, min_size=1, max_size=8),
)
def test_topic_exchange_routes_as_its_live_bindings_match(
    ops: list[tuple[bool, str, str]], keys: list[str]
) -> None:
    """Bindings added and removed in any order, keys routed between the changes: the trie
    and its cache answer as topic_matches over the live bindings does."""
    r = make()
    live: set[tuple[str, str]] = set()
    for add, queue, pattern in ops:
        b = q("amq.topic", queue, pattern)
        if add:
            assert r.add_binding(b) == ((queue, pattern) not in live)
            live.add((queue, pattern))
        else:
            assert r.remove_binding(b) == ((queue, pattern) in live)
            live.discard((queue, pattern))
        for key in keys:
            want = tuple(sorted({d for d, p in live if topic_matches(p, key)}))
            assert r.route("amq.topic", key, {}) == Route(want), (key, live)
    for queue, pattern in live:
        assert r.remove_binding(q("amq.topic", queue, pattern))
    trie = r._exchanges["amq.topic"].trie
    assert (trie.children, trie.bindings) == ({}, {})  # pruned


HEADERS = st.dictionaries(
    st.sampled_from(["a", "b", "x-c"]), st.sampled_from(["1", "2"]), max_size=3
)
ARGUMENTS = st.tuples(st.sampled_from([None, *MATCH_MODES]), HEADERS).map(
    lambda m: ((("x-match", m[0]),) if m[0] else ()) + tuple(m[1].items())
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), st.sampled_from(["q1", "q2", "q3"]), ARGUMENTS), max_size=20),
    st.lists(HEADERS, min_size=1, max_size=6),
)
def test_headers_exchange_routes_as_its_live_bindings_match(
    ops: list[tuple[bool, str, tuple[tuple[str, str], ...]]], messages: list[dict[str, str]]
) -> None:
    """The headers exchange's index answers as headers_match over the live bindings, and
    is empty again once they are all removed."""
    r = make()
    live: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for add, queue, arguments in ops:
        b = q("amq.headers", queue, arguments=arguments)
        if add:
            r.add_binding(b)
            live.add((queue, arguments))
        else:
            r.remove_binding(b)
            live.discard((queue, arguments))
        for headers in messages:
            want = tuple(sorted({d for d, a in live if headers_match(a, headers)}))
            assert r.route("amq.headers", "", headers) == Route(want), (headers, live)
    for queue, arguments in live:
        assert r.remove_binding(q("amq.headers", queue, arguments=arguments))
    ex = r._exchanges["amq.headers"]
    assert (ex.headers, ex.by_pair, ex.always) == ({}, {}, {})
