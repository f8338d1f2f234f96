"""Fuzzing from the API's own OpenAPI spec (schemathesis): requests generated from
``/openapi.json`` for every operation, valid and invalid; no answer is a 5xx, and every answer
(status, content type, body) is one the spec declares for it.

Bounded: a few dozen examples per operation, a few hundred in all.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.http._support import served
from tidewire.security.config import SecurityConfig

#: Examples per operation and mode: 12 operations, positive and negative, ~250 requests.
EXAMPLES = 10
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data: Path = tmp_path_factory.mktemp("fuzz")
    # Generated requests carry made-up credentials: a failed authentication is answered at
    # once here, not after the anti-guessing delay (1 s by default), which would be most of
    # the run's time.
    with served(
        data,
        default_partitions=2,
        max_wait_ms=50,
        security=SecurityConfig(auth_failure_delay_ms=0),
    ) as (_, client):
        # Something to find: a topic, messages, a group.
        client.post("/v1/topics", json={"name": "t", "partitions": 2})
        client.post("/v1/topics/t/messages", json={"value": "x", "partition": 0})
        client.post(
            "/v1/groups/g/commit", json={"offsets": [{"topic": "t", "partition": 0, "offset": 1}]}
        )
        yield str(client.base_url).rstrip("/")


def _operations(base_url: str) -> list[Any]:
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    return [op.ok() for op in schema.get_all_operations()]


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_the_api_matches_its_spec(base_url: str, mode: str) -> None:
    ops = _operations(base_url)
    assert len(ops) >= 12
    generation = schemathesis.GenerationMode(mode)
    failures: list[str] = []
    unsatisfiable: list[str] = []
    for op in ops:

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
            phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
        )
        @hypothesis.given(case=op.as_strategy(generation_mode=generation))
        def run(case: Any) -> None:
            # Long-polls wait up to the broker's max_wait_ms (50 ms here).
            case.call_and_validate(base_url=base_url, checks=CHECKS, timeout=30)

        try:
            run()
        except hypothesis.errors.Unsatisfiable:
            # No invalid request exists (no parameters, or none that can be wrong).
            assert mode == "negative", f"{op.method.upper()} {op.path}"
            unsatisfiable.append(f"{op.method.upper()} {op.path}")
        except Exception as exc:  # collected, so one run reports every operation at fault
            failures.append(f"{op.method.upper()} {op.path}: {str(exc)[:3000]}")
    assert not failures, "\n\n".join(failures)
    # Every operation with a body got invalid ones.
    assert not [u for u in unsatisfiable if u.startswith("POST")], unsatisfiable
