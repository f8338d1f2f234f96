"""The JSON log format and the level helpers, record by record."""

from __future__ import annotations

import contextvars
import io
import json
import logging
import re
from pathlib import Path

import pytest

from tests.client._support import addr, run, serve
from tidewire.client import AsyncClient
from tidewire.observability import logs


def _line(out: io.StringIO) -> dict[str, object]:
    lines = out.getvalue().splitlines()
    assert len(lines) == 1, lines
    doc = json.loads(lines[0])
    assert isinstance(doc, dict)
    return doc


def test_one_json_object_per_line_with_the_bound_request() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.JsonFormatter())
    lg = logging.getLogger("tidewire.test.json")
    lg.addHandler(handler)
    lg.setLevel(logging.DEBUG)
    lg.propagate = False

    def in_request() -> None:
        logs.bind_request("c3", "c3-9", "PRODUCE", "alice")
        lg.warning("slow append: %d ms\nsecond line", 120)

    try:
        contextvars.copy_context().run(in_request)
        doc = _line(out)
        assert doc == {
            "ts": doc["ts"],
            "level": "WARNING",
            "logger": "tidewire.test.json",
            "message": "slow append: 120 ms\nsecond line",
            "connection_id": "c3",
            "request_id": "c3-9",
            "api": "PRODUCE",
            "principal": "alice",
        }
        out.truncate(0)
        out.seek(0)
        try:
            raise ValueError("boom")
        except ValueError:
            lg.exception("failed")
        doc = _line(out)
        assert "request_id" not in doc  # outside the request's context
        assert "ValueError: boom" in str(doc["exc"])
    finally:
        lg.removeHandler(handler)


def test_configure_logging_and_levels() -> None:
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    out = io.StringIO()
    try:
        logs.configure_logging("json", "warning", stream=out)
        logging.getLogger("tidewire.test.cfg").info("hidden")
        logging.getLogger("tidewire.test.cfg").error("shown")
        (line,) = out.getvalue().splitlines()
        assert json.loads(line)["message"] == "shown"
        with pytest.raises(ValueError, match="log format 'xml' is not one of text, json"):
            logs.configure_logging("xml")
        with pytest.raises(ValueError, match="not one of CRITICAL, ERROR, WARNING"):
            logs.configure_logging("text", "loud")
        assert logs.set_level("tidewire.test.cfg", "debug") == "DEBUG"
        got = {name: (level, eff) for name, level, eff in logs.levels()}
        assert got["tidewire.test.cfg"] == ("DEBUG", "DEBUG")
        assert got["root"] == ("WARNING", "WARNING")
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved_handlers:
            root.addHandler(h)
        root.setLevel(saved_level)
        logging.getLogger("tidewire.test.cfg").setLevel(logging.NOTSET)


def test_request_ids_a_log_line_may_carry() -> None:
    assert logs.valid_request_id("0af76519-16cd:43dd")
    assert not logs.valid_request_id("")
    assert not logs.valid_request_id("a b")
    assert not logs.valid_request_id('{"x"}')
    assert not logs.valid_request_id("x" * 129)
    assert len(logs.new_request_id()) == 32


def test_a_binary_request_s_log_lines_name_it(tmp_path: Path) -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.JsonFormatter())
    lg = logging.getLogger("tidewire.broker")
    saved = lg.level
    lg.addHandler(handler)
    lg.setLevel(logging.INFO)

    async def main() -> None:
        async with serve(tmp_path) as (_, server), AsyncClient(addr(server)) as client:
            await client.create_topic("audited", 1)
            await client.create_topic("second", 1)

    try:
        run(main())
    finally:
        lg.removeHandler(handler)
        lg.setLevel(saved)
    docs = [json.loads(line) for line in out.getvalue().splitlines()]
    created = [d for d in docs if d["message"].startswith("created topic")]
    assert [d["message"].split(" with ")[0] for d in created] == [
        "created topic audited",
        "created topic second",
    ]
    first, second = created
    assert re.fullmatch(r"c\d+", first["connection_id"])
    assert first["connection_id"] == second["connection_id"]  # one client connection
    assert first["request_id"].startswith(first["connection_id"] + "-")
    assert first["request_id"] != second["request_id"]
    assert first["api"] == second["api"] == "CREATE_TOPIC"
    assert "principal" not in first  # anonymous
