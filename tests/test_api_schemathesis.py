"""schemathesis against our own OpenAPI document, on a real server: generated
requests (valid and invalid by the schema) never get a 5xx, and every
answer matches the schema (status code, content type, headers, body)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from api_cases import ServerThread, service_settings
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

pytestmark = [pytest.mark.solver, pytest.mark.slow]

#: Examples per generation mode, over all operations together.
EXAMPLES = 300  # about 10 per operation, scale-plan routes included

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    data: Path = tmp_path_factory.mktemp("schemathesis")
    with ServerThread(service_settings(data, queue_size=4)) as s:
        yield s


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_server_errors_and_answers_match_the_schema(server, mode):
    # schemathesis' pytest plugin does not run under pytest 9, so drive its
    # Hypothesis strategy (every operation of the schema) directly.
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    operations = {
        f"{r.ok().method.upper()} {r.ok().path}" for r in schema.get_all_operations()
    }
    assert {
        "POST /v1/plans",
        "POST /v1/jobs",
        "POST /v1/evaluate",
        "DELETE /v1/jobs/{job_id}",
        # The dashboard's pages and forms are in the schema too.
        "GET /",
        "GET /plans/{plan_id}",
        "POST /plans/{plan_id}/try",
        "GET /jobs/{job_id}",
        "POST /jobs/{job_id}/cancel",
    } <= operations
    seen: set[str] = set()

    @given(case=schema.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def check(case: Any) -> None:
        seen.add(f"{case.method.upper()} {case.path}")
        case.call_and_validate(checks=CHECKS, timeout=60)

    check()
    if mode is GenerationMode.POSITIVE:
        assert seen == operations
    else:  # only operations with parameters or a body can be sent invalid data
        assert {
            "POST /v1/plans",
            "POST /v1/jobs",
            "POST /v1/evaluate",
            "POST /plans/{plan_id}/try",
        } <= seen
