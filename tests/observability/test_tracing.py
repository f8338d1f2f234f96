"""Tracing end to end: a message published with a producer and read with a consumer, through
a real broker and server on port 0, leaves a publish span, the broker's produce span and the
consumer's receive span, linked through the ``traceparent`` the producer wrote into the
record's headers; without an SDK nothing is added."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind, StatusCode

from tests.client._support import addr, in_thread, run, serve
from tests.observability._support import named, traced
from tidewire import tracing
from tidewire.client import (
    AsyncClient,
    AsyncConsumer,
    AsyncGroupConsumer,
    AsyncProducer,
    Consumer,
    Producer,
)
from tidewire.client._consumer import ConsumerRecord
from tidewire.errors import TidewireError

FAST = {"session_timeout_ms": 1_000, "heartbeat_interval_ms": 100, "max_wait_ms": 100}


def _linked(span: ReadableSpan, to: ReadableSpan) -> bool:
    assert to.context is not None
    return any(
        link.context.span_id == to.context.span_id and link.context.trace_id == to.context.trace_id
        for link in span.links
    )


def _traceparent(record: ConsumerRecord) -> str | None:
    for k, v in record.headers:
        if k == "traceparent":
            assert v is not None
            return v.decode()
    return None


def test_produce_then_consume_leaves_linked_spans(tmp_path: Path) -> None:
    async def main() -> None:
        with traced() as exporter:
            async with serve(tmp_path) as (_, server), AsyncClient(addr(server)) as client:
                await client.create_topic("orders", 2)
                port = server.port
                async with AsyncProducer(addr(server), linger_ms=0) as producer:
                    meta = await (
                        await producer.send("orders", b"one", partition=1, headers=[("app", b"x")])
                    )
                async with AsyncConsumer(addr(server)) as consumer:
                    await consumer.assign([("orders", 1, "earliest")])
                    (record,) = await consumer.poll(5.0)
                    with tracing.process_span(record) as processing:
                        assert processing is not None
                    with tracing.process_span(record, group="g", link=True) as linked:
                        assert linked is not None
            spans = exporter.get_finished_spans()

        # The producer: one send span, its context in the record's headers.
        (send,) = named(spans, "send orders")
        assert send.kind is SpanKind.PRODUCER
        attrs = dict(send.attributes or {})
        assert attrs["messaging.system"] == "tidewire"
        assert attrs["messaging.operation.type"] == "publish"
        assert attrs["messaging.destination.name"] == "orders"
        assert attrs["messaging.destination.partition.id"] == "1"
        assert attrs["messaging.message.id"] == f"1:{meta.offset}"
        assert attrs["server.address"] == "127.0.0.1"
        assert attrs["server.port"] == port
        assert send.context is not None
        parent = _traceparent(record)
        assert parent is not None
        assert parent.startswith(f"00-{send.context.trace_id:032x}-{send.context.span_id:016x}-")
        assert int(parent[-2:], 16) & 0x01  # sampled
        assert ("app", b"x") in record.headers  # the caller's headers are kept

        # The broker: a produce span per request, linked to the send span.
        (produce,) = named(spans, "produce orders")
        assert produce.kind is SpanKind.SERVER
        pattrs = dict(produce.attributes or {})
        assert pattrs["messaging.operation.type"] == "publish"
        assert pattrs["messaging.destination.name"] == "orders"
        assert pattrs["messaging.destination.partition.id"] == "1"
        assert pattrs["messaging.batch.message_count"] == 1
        assert _linked(produce, send)
        fetches = named(spans, "fetch orders")
        assert fetches
        assert all(
            dict(f.attributes or {})["messaging.operation.type"] == "receive" for f in fetches
        )
        # The consumer's next fetch is on its way as soon as a record is handed out: the one
        # still long-polling when the consumer closed ends cancelled, without a count.
        answered = [f for f in fetches if "error.type" not in dict(f.attributes or {})]
        assert all(
            dict(f.attributes or {})["error.type"] == "CancelledError"
            for f in fetches
            if f not in answered
        )
        counts = [dict(f.attributes or {})["messaging.batch.message_count"] for f in answered]
        assert sum(counts) == 1  # the one record, in whichever fetch brought it

        # The consumer: a receive span linked to the send span; a process span its child.
        (poll,) = named(spans, "poll orders")
        assert poll.kind is SpanKind.CONSUMER
        rattrs = dict(poll.attributes or {})
        assert rattrs["messaging.operation.type"] == "receive"
        assert rattrs["messaging.batch.message_count"] == 1
        assert rattrs["messaging.destination.partition.id"] == "1"
        assert _linked(poll, send)
        process, separate = named(spans, "process orders")
        assert separate.parent is None  # a trace of its own, linked to the producer's
        assert _linked(separate, send)
        assert dict(separate.attributes or {})["messaging.consumer.group.name"] == "g"
        assert process.parent is not None
        assert process.parent.span_id == send.context.span_id
        assert process.context is not None
        assert process.context.trace_id == send.context.trace_id
        assert dict(process.attributes or {})["messaging.operation.type"] == "process"

    run(main())


def test_without_an_sdk_no_header_is_added(tmp_path: Path) -> None:
    async def main() -> None:
        assert tracing.tracer() is None  # the API's no-op provider
        async with serve(tmp_path) as (_, server), AsyncClient(addr(server)) as client:
            await client.create_topic("t", 1)
            async with AsyncProducer(addr(server), linger_ms=0) as producer:
                await (await producer.send("t", b"v", headers=[("app", b"x")]))
                await (await producer.send("t", b"w"))
            async with AsyncConsumer(addr(server)) as consumer:
                await consumer.assign([("t", 0, "earliest")])
                records: list[ConsumerRecord] = []
                while len(records) < 2:
                    records += await consumer.poll(5.0)
        assert [r.headers for r in records] == [(("app", b"x"),), ()]
        with tracing.process_span(records[0]) as span:
            assert span is None
        assert (
            not trace.get_current_span(tracing.context_of(records[0])).get_span_context().is_valid
        )

    run(main())


def test_blocking_clients_and_a_group_trace_too(tmp_path: Path) -> None:
    async def main() -> None:
        with traced() as exporter:
            async with serve(tmp_path) as (_, server), AsyncClient(addr(server)) as client:
                await client.create_topic("t", 1)

                def produce() -> None:
                    with Producer(addr(server), linger_ms=0) as p:
                        p.send("t", b"sync").result(10)

                await in_thread(produce)

                def consume() -> ConsumerRecord:
                    with Consumer(addr(server)) as c:
                        c.assign([("t", 0, "earliest")])
                        return next(iter(c))

                record = await in_thread(consume)
                async with AsyncGroupConsumer(
                    addr(server), "billing", topics=["t"], auto_offset_reset="earliest", **FAST
                ) as member:
                    got: list[ConsumerRecord] = []
                    while not got:
                        got = await member.poll(5.0)
                    await member.commit()
            spans = exporter.get_finished_spans()
        (send,) = named(spans, "send t")
        assert send.context is not None
        assert _traceparent(record) is not None
        assert _traceparent(got[0]) == _traceparent(record)
        polls = named(spans, "poll t")
        assert len(polls) == 2
        assert all(_linked(p, send) for p in polls)
        groups = [dict(p.attributes or {}).get("messaging.consumer.group.name") for p in polls]
        assert groups == [None, "billing"]  # the plain consumer, then the member
        assert named(spans, "join_group billing")
        commits = named(spans, "commit billing")  # the explicit one, and auto-commits
        assert commits
        for commit in commits:
            cattrs = dict(commit.attributes or {})
            assert cattrs["messaging.operation.type"] == "settle"
            assert cattrs["messaging.consumer.group.name"] == "billing"
            assert commit.status.status_code is not StatusCode.ERROR

    run(main())


def test_a_failed_request_names_its_error(tmp_path: Path) -> None:
    async def main() -> None:
        with traced() as exporter:
            async with serve(tmp_path) as (_, server), AsyncConsumer(addr(server)) as consumer:
                await consumer.assign([("missing", 0, 0)])
                with pytest.raises(TidewireError):
                    await consumer.poll(2.0)
            spans = exporter.get_finished_spans()
        fetches = named(spans, "fetch missing")
        assert fetches
        f = fetches[0]
        assert f.status.status_code is StatusCode.ERROR
        assert dict(f.attributes or {})["error.type"].endswith("Error")

    run(main())


def test_a_sampled_out_send_still_carries_its_context(tmp_path: Path) -> None:
    async def main() -> ConsumerRecord:
        provider = TracerProvider(sampler=ALWAYS_OFF)
        tracing.use_tracer_provider(provider)
        try:
            async with serve(tmp_path) as (_, server), AsyncClient(addr(server)) as client:
                await client.create_topic("t", 1)
                async with AsyncProducer(addr(server), linger_ms=0) as producer:
                    await (await producer.send("t", b"v"))
                async with AsyncConsumer(addr(server)) as consumer:
                    await consumer.assign([("t", 0, "earliest")])
                    (record,) = await consumer.poll(5.0)
                    return record
        finally:
            tracing.use_tracer_provider(None)

    record = run(main())
    parent = _traceparent(record)
    assert parent is not None
    assert not int(parent[-2:], 16) & 0x01  # not sampled: downstream does not record it either
