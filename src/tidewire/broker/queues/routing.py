"""Exchanges and bindings in memory, and where a published message goes (pure: no I/O).

Routing follows RabbitMQ's rules:

- ``direct``: the bindings whose key equals the routing key.
- ``fanout``: every binding; keys are ignored.
- ``topic``: keys and patterns are words separated by ``.`` (``""`` is no word at all;
  ``"a..b"`` is three words, the middle one empty); in a pattern, a word ``*`` matches
  exactly one word and a word ``#`` zero or more, so ``#`` alone matches every key and
  ``a.#.b`` matches ``a.b``, ``a.x.b`` and ``a.x.y.b``. ``*`` or ``#`` inside a longer word
  is a literal character.
- ``headers``: the binding's arguments against the message's headers (:func:`headers_match`).
- the default exchange ``""``: the queue named by the routing key, when it exists; nothing
  can be bound to it, nor can it be deleted.

When no binding of an exchange matches, the message goes through its alternate exchange
(and that one's, in turn), each exchange at most once. :meth:`Router.route` answers from
per-exchange indexes: a dict per direct exchange, one precomputed answer per fanout
exchange, a trie of patterns with a bounded cache of answers per topic exchange (both
rebuilt only as bindings change), and per headers exchange its bindings indexed by a
header (name, value) pair a matching message must have.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from tidewire.broker.queues.model import (
    DEFAULT_EXCHANGE,
    EXCHANGE_TYPES,
    Binding,
    ExchangeSpec,
    check_name,
)
from tidewire.errors import InvalidQueueError, PreconditionFailedError, UnknownExchangeError

__all__ = [
    "BUILTIN_EXCHANGES",
    "MATCH_MODES",
    "MAX_KEY_BYTES",
    "TOPIC_CACHE_SIZE",
    "Route",
    "Router",
    "headers_match",
    "topic_matches",
]

#: The exchanges every broker has, as RabbitMQ does; they can be neither deleted nor
#: redeclared with other settings.
BUILTIN_EXCHANGES: tuple[ExchangeSpec, ...] = (
    ExchangeSpec(DEFAULT_EXCHANGE, "direct"),
    ExchangeSpec("amq.direct", "direct"),
    ExchangeSpec("amq.fanout", "fanout"),
    ExchangeSpec("amq.topic", "topic"),
    ExchangeSpec("amq.headers", "headers"),
)
#: Values of a headers binding's ``x-match`` argument (``all`` when absent). The ``-with-x``
#: forms also compare the arguments whose names begin with ``x-``.
MATCH_MODES = ("all", "any", "all-with-x", "any-with-x")
#: Longest binding key, in UTF-8 bytes: AMQP's short string, as RabbitMQ allows.
MAX_KEY_BYTES = 255
#: Routing keys whose answer a topic exchange remembers (per exchange): enough for the
#: working set of keys of a busy exchange, a few hundred KiB at most; forgotten whenever a
#: binding of that exchange changes.
TOPIC_CACHE_SIZE = 4096


@dataclass(frozen=True, slots=True)
class Route:
    """Where a message goes: queue names and topic names, each once, sorted."""

    queues: tuple[str, ...] = ()
    topics: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.queues or self.topics)


_NOWHERE = Route()


def _words(s: str) -> list[str]:
    return s.split(".") if s else []


def topic_matches(pattern: str, routing_key: str) -> bool:
    """Whether a topic exchange's binding ``pattern`` matches ``routing_key``.

    Words are separated by ``.``; ``""`` has none. A pattern word ``*`` matches exactly one
    word, ``#`` zero or more; any other word matches only itself.
    """
    words = _words(routing_key)
    n = len(words)
    # The positions in the key that the pattern read so far can end at (ascending).
    at: list[int] = [0]
    for w in _words(pattern):
        if w == "#":
            at = list(range(at[0], n + 1))
        elif w == "*":
            at = [i + 1 for i in at if i < n]
        else:
            at = [i + 1 for i in at if i < n and words[i] == w]
        if not at:
            return False
    return at[-1] == n


def _match_mode(arguments: Sequence[tuple[str, str]]) -> str:
    mode = "all"
    for name, value in arguments:
        if name == "x-match":
            mode = value
    if mode not in MATCH_MODES:
        raise InvalidQueueError(
            f"binding argument x-match={mode!r} must be one of {', '.join(MATCH_MODES)}"
        )
    return mode


def _compiled(arguments: Sequence[tuple[str, str]]) -> tuple[bool, tuple[tuple[str, str], ...]]:
    """(any?, the pairs to compare) of a headers binding."""
    mode = _match_mode(arguments)
    with_x = mode.endswith("-with-x")
    pairs = tuple(
        (k, v) for k, v in arguments if k != "x-match" and (with_x or not k.startswith("x-"))
    )
    return mode.startswith("any"), pairs


def _match_compiled(
    any_: bool, pairs: tuple[tuple[str, str], ...], headers: Mapping[str, str]
) -> bool:
    if any_:
        return any(headers.get(k) == v for k, v in pairs)
    return all(headers.get(k) == v for k, v in pairs)


def headers_match(arguments: Sequence[tuple[str, str]], headers: Mapping[str, str]) -> bool:
    """Whether a headers exchange's binding ``arguments`` match a message's ``headers``.

    ``x-match`` ``all`` (the default): every argument is a header of equal value (so a
    binding with no other arguments matches every message); ``any``: at least one is.
    Arguments whose names begin with ``x-`` take no part, unless ``x-match`` is
    ``all-with-x`` or ``any-with-x``; ``x-match`` itself never does.

    Raises:
        InvalidQueueError: an ``x-match`` that is none of :data:`MATCH_MODES`.
    """
    any_, pairs = _compiled(arguments)
    return _match_compiled(any_, pairs, headers)


def _route_of(bindings: Iterable[Binding]) -> Route:
    queues: set[str] = set()
    topics: set[str] = set()
    for b in bindings:
        (queues if b.destination_kind == "queue" else topics).add(b.destination)
    if not queues and not topics:
        return _NOWHERE
    return Route(tuple(sorted(queues)), tuple(sorted(topics)))


@dataclass(eq=False, slots=True)
class _Node:
    """A node of a topic exchange's trie: one edge per pattern word."""

    children: dict[str, _Node] = field(default_factory=dict)
    bindings: dict[Binding, None] = field(default_factory=dict)


class _Exchange:
    """An exchange, its bindings (in the order made) and its routing index."""

    __slots__ = (
        "always",
        "bindings",
        "by_key",
        "by_pair",
        "cache",
        "fanout",
        "headers",
        "spec",
        "trie",
    )

    def __init__(self, spec: ExchangeSpec) -> None:
        self.spec = spec
        self.bindings: dict[Binding, None] = {}
        self.by_key: dict[str, dict[Binding, None]] = {}  # direct
        # direct, fanout and topic answers, built when first asked after a change
        self.cache: OrderedDict[str, Route] = OrderedDict()
        self.fanout: Route | None = None
        self.trie = _Node()  # topic
        # headers: each binding's (any?, pairs); those matching every message ("all" of
        # nothing); the others by a pair a matching message must have ("all": its first;
        # "any": each), so a message is compared with the bindings of its own pairs only.
        self.headers: dict[Binding, tuple[bool, tuple[tuple[str, str], ...]]] = {}
        self.always: dict[Binding, None] = {}
        self.by_pair: dict[tuple[str, str], dict[Binding, None]] = {}

    def add(self, b: Binding) -> None:
        self.bindings[b] = None
        t = self.spec.type
        if t == "direct":
            self.by_key.setdefault(b.key, {})[b] = None
            self.cache.pop(b.key, None)
        elif t == "fanout":
            self.fanout = None
        elif t == "topic":
            node = self.trie
            for w in _words(b.key):
                node = node.children.setdefault(w, _Node())
            node.bindings[b] = None
            self.cache.clear()
        else:
            any_, pairs = self.headers[b] = _compiled(b.arguments)
            if not pairs and not any_:  # ("any" of nothing matches nothing: not indexed)
                self.always[b] = None
            for pair in pairs if any_ else pairs[:1]:
                self.by_pair.setdefault(pair, {})[b] = None

    def remove(self, b: Binding) -> None:
        del self.bindings[b]
        t = self.spec.type
        if t == "direct":
            same = self.by_key[b.key]
            del same[b]
            if not same:
                del self.by_key[b.key]
            self.cache.pop(b.key, None)
        elif t == "fanout":
            self.fanout = None
        elif t == "topic":
            path = [self.trie]
            words = _words(b.key)
            for w in words:
                path.append(path[-1].children[w])
            del path[-1].bindings[b]
            for i in range(len(words) - 1, -1, -1):  # prune the nodes left empty
                child = path[i + 1]
                if child.bindings or child.children:
                    break
                del path[i].children[words[i]]
            self.cache.clear()
        else:
            any_, pairs = self.headers.pop(b)
            self.always.pop(b, None)
            for pair in pairs if any_ else pairs[:1]:
                same = self.by_pair[pair]
                del same[b]
                if not same:
                    del self.by_pair[pair]

    def route(self, routing_key: str, headers: Mapping[str, str]) -> Route:
        t = self.spec.type
        if t == "direct":
            r = self.cache.get(routing_key)
            if r is None:
                same = self.by_key.get(routing_key)
                if same is None:
                    return _NOWHERE
                r = self.cache[routing_key] = _route_of(same)
            return r
        if t == "fanout":
            if self.fanout is None:
                self.fanout = _route_of(self.bindings)
            return self.fanout
        if t == "topic":
            cache = self.cache
            r = cache.get(routing_key)
            if r is not None:
                cache.move_to_end(routing_key)
                return r
            r = _route_of(self._topic_bindings(routing_key))
            cache[routing_key] = r
            if len(cache) > TOPIC_CACHE_SIZE:
                cache.popitem(last=False)
            return r
        found = list(self.always)
        if self.by_pair:
            for pair in headers.items():
                candidates = self.by_pair.get(pair)
                if candidates is not None:
                    for b in candidates:
                        any_, pairs = self.headers[b]
                        if any_ or _match_compiled(False, pairs, headers):
                            found.append(b)
        return _route_of(found)

    def _topic_bindings(self, routing_key: str) -> list[Binding]:
        """The bindings whose pattern matches: a walk of the trie that visits each (node,
        position in the key) once, so patterns with several ``#`` stay linear."""
        words = _words(routing_key)
        n = len(words)
        found: list[Binding] = []
        seen: set[tuple[int, int]] = set()
        stack: list[tuple[_Node, int]] = [(self.trie, 0)]
        while stack:
            node, i = stack.pop()
            mark = (id(node), i)
            if mark in seen:
                continue
            seen.add(mark)
            children = node.children
            if i == n:
                found.extend(node.bindings)
            else:
                child = children.get(words[i])
                if child is not None:
                    stack.append((child, i + 1))
                star = children.get("*")
                if star is not None:
                    stack.append((star, i + 1))
            rest = children.get("#")
            if rest is not None:
                stack.extend((rest, j) for j in range(i, n + 1))
        return found


class Router:
    """Every exchange and binding of a broker, in memory, and the routing of a publish.

    The default exchange ``""`` and ``amq.direct``, ``amq.fanout``, ``amq.topic`` and
    ``amq.headers`` are always there (:data:`BUILTIN_EXCHANGES`). The default exchange's
    bindings (every queue by its name) are implicit: :meth:`bindings` does not list them.
    The router does not check that a binding's destination exists: its caller does, and
    removes a deleted queue's bindings with :meth:`remove_destination`.

    Args:
        queue_exists: whether a queue of that name exists (for the default exchange).
    """

    def __init__(self, queue_exists: Callable[[str], bool]) -> None:
        self._queue_exists = queue_exists
        self._exchanges: dict[str, _Exchange] = {}
        self._specs: dict[str, ExchangeSpec] = {}
        #: Read-only view: exchange name -> its spec.
        self.exchanges: Mapping[str, ExchangeSpec] = MappingProxyType(self._specs)
        # (kind, destination) -> its bindings, for remove_destination and bindings(destination=)
        self._by_destination: dict[tuple[str, str], dict[Binding, None]] = {}
        for spec in BUILTIN_EXCHANGES:
            self._exchanges[spec.name] = _Exchange(spec)
            self._specs[spec.name] = spec

    # --- exchanges --------------------------------------------------------------------------

    def add_exchange(self, spec: ExchangeSpec) -> None:
        """Add an exchange; one of that name and equal spec is left as it is.

        Raises:
            InvalidQueueError: a name or type that is not allowed (names beginning ``amq.``
                are the broker's), or an alternate exchange name that is not.
            PreconditionFailedError: the exchange exists with other settings.
        """
        current = self._specs.get(spec.name)
        if current is not None and current == spec:
            return
        if current is not None and current in BUILTIN_EXCHANGES:
            raise InvalidQueueError(
                f"exchange {_shown(spec.name)} is built in (type {current.type}, durable): "
                "it cannot be declared with other settings"
            )
        check_name("exchange", spec.name)
        if spec.type not in EXCHANGE_TYPES:
            raise InvalidQueueError(
                f"exchange {spec.name!r}: type {spec.type!r} must be one of "
                f"{', '.join(EXCHANGE_TYPES)}"
            )
        if spec.alternate_exchange:
            check_name("alternate exchange", spec.alternate_exchange, reserved_ok=True)
        if current is not None:
            raise PreconditionFailedError(
                f"exchange {spec.name!r} exists with type={current.type}, "
                f"durable={current.durable}, alternate_exchange={current.alternate_exchange!r}; "
                f"declared with type={spec.type}, durable={spec.durable}, "
                f"alternate_exchange={spec.alternate_exchange!r}"
            )
        self._exchanges[spec.name] = _Exchange(spec)
        self._specs[spec.name] = spec

    def remove_exchange(self, name: str) -> list[Binding]:
        """Remove an exchange and its bindings, returning those bindings.

        Raises:
            UnknownExchangeError: no exchange of that name.
            InvalidQueueError: a built-in exchange (:data:`BUILTIN_EXCHANGES`).
        """
        ex = self._get(name)
        if ex.spec in BUILTIN_EXCHANGES:
            raise InvalidQueueError(f"exchange {_shown(name)} is built in: it cannot be deleted")
        removed = list(ex.bindings)
        for b in removed:
            self._unindex(b)
        del self._exchanges[name], self._specs[name]
        return removed

    def _get(self, name: str) -> _Exchange:
        ex = self._exchanges.get(name)
        if ex is None:
            raise UnknownExchangeError(f"no exchange {_shown(name)}")
        return ex

    # --- bindings ---------------------------------------------------------------------------

    def add_binding(self, b: Binding) -> bool:
        """Add a binding; False when it existed already (nothing changes).

        Raises:
            UnknownExchangeError: its exchange does not exist.
            InvalidQueueError: the default exchange; a destination kind other than queue or
                topic; an empty destination; a key over :data:`MAX_KEY_BYTES` bytes; binding
                arguments with an empty or repeated name, or a headers binding's ``x-match``
                that is not one of :data:`MATCH_MODES`.
        """
        if b.exchange == DEFAULT_EXCHANGE:
            raise InvalidQueueError(
                "nothing can be bound to the default exchange: it routes to the queue named "
                "by the routing key"
            )
        ex = self._get(b.exchange)
        if b in ex.bindings:
            return False
        _check_binding(b, ex.spec.type)
        ex.add(b)
        self._by_destination.setdefault((b.destination_kind, b.destination), {})[b] = None
        return True

    def remove_binding(self, b: Binding) -> bool:
        """Remove a binding; False when there was none (an unknown exchange included)."""
        ex = self._exchanges.get(b.exchange)
        if ex is None or b not in ex.bindings:
            return False
        self._unindex(b)
        return True

    def _unindex(self, b: Binding) -> None:
        self._exchanges[b.exchange].remove(b)
        dest = (b.destination_kind, b.destination)
        same = self._by_destination[dest]
        del same[b]
        if not same:
            del self._by_destination[dest]

    def bindings(
        self,
        *,
        exchange: str | None = None,
        destination: str | None = None,
        kind: str | None = None,
    ) -> list[Binding]:
        """The bindings (the default exchange's implicit ones left out), filtered by exchange,
        destination name and destination kind; by exchange name, then in the order made."""
        if destination is not None:
            kinds = ("queue", "topic") if kind is None else (kind,)
            found = [
                b
                for k in kinds
                for b in self._by_destination.get((k, destination), {})
                if exchange is None or b.exchange == exchange
            ]
            order = {name: i for i, name in enumerate(sorted(self._exchanges))}
            found.sort(key=lambda b: order[b.exchange])  # stable: the order made within
            return found
        names = sorted(self._exchanges) if exchange is None else [exchange]
        return [
            b
            for name in names
            if (ex := self._exchanges.get(name)) is not None
            for b in ex.bindings
            if kind is None or b.destination_kind == kind
        ]

    def remove_destination(self, kind: str, name: str) -> list[Binding]:
        """Remove every binding to the queue or topic ``name`` (it was deleted), returning
        them."""
        removed = list(self._by_destination.get((kind, name), {}))
        for b in removed:
            self._unindex(b)
        return removed

    def has_bindings(self, exchange: str) -> bool:
        """Whether ``exchange`` has bindings (False for an unknown one): an exchange deleted
        ``if_unused`` must have none."""
        ex = self._exchanges.get(exchange)
        return ex is not None and bool(ex.bindings)

    # --- routing ----------------------------------------------------------------------------

    def route(self, exchange: str, routing_key: str, headers: Mapping[str, str]) -> Route:
        """Where a message published to ``exchange`` with ``routing_key`` and ``headers``
        goes: the destinations of the matching bindings, or, when none matches, those its
        alternate exchange gives (followed in turn, each exchange once; an alternate exchange
        that does not exist routes nowhere).

        Raises:
            UnknownExchangeError: ``exchange`` does not exist.
        """
        if exchange == DEFAULT_EXCHANGE:
            return Route((routing_key,)) if self._queue_exists(routing_key) else _NOWHERE
        ex = self._get(exchange)
        r = ex.route(routing_key, headers)
        if r or not ex.spec.alternate_exchange:
            return r
        seen = {exchange}
        while (alternate := ex.spec.alternate_exchange) and alternate not in seen:
            seen.add(alternate)
            next_ex = self._exchanges.get(alternate)
            if next_ex is None:
                return _NOWHERE
            ex = next_ex
            r = ex.route(routing_key, headers)
            if r:
                return r
        return _NOWHERE


def _shown(name: str) -> str:
    return 'amq.default ("")' if name == DEFAULT_EXCHANGE else repr(name)


def _check_binding(b: Binding, exchange_type: str) -> None:
    if b.destination_kind == "queue":
        check_name("queue", b.destination, reserved_ok=True)
    elif b.destination_kind == "topic":
        if not b.destination:
            raise InvalidQueueError("a binding's destination topic name must not be empty")
    else:
        raise InvalidQueueError(
            f"binding destination kind {b.destination_kind!r} must be queue or topic"
        )
    size = len(b.key.encode())
    if size > MAX_KEY_BYTES:
        raise InvalidQueueError(
            f"binding key of {size} bytes exceeds the limit of {MAX_KEY_BYTES} bytes"
        )
    names: set[str] = set()
    for name, _ in b.arguments:
        if not name:
            raise InvalidQueueError("a binding argument's name must not be empty")
        if name in names:
            raise InvalidQueueError(f"binding argument {name!r} given more than once")
        names.add(name)
    if exchange_type == "headers":
        _match_mode(b.arguments)
