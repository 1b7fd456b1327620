"""Job status is an enum (api.store.base.JobStatus), from the store's rows to
the wire schema."""

from __future__ import annotations

import pytest

from api.schemas import JobOut
from api.store.base import UNFINISHED, JobRecord, JobStatus


def _job(status: str) -> JobRecord:
    return JobRecord("j1", "h", status, "p", 0.0, 1.0, 2.0, "replica")


def test_a_row_status_becomes_the_member_and_reads_as_its_string() -> None:
    job = _job("running")
    assert job.status is JobStatus.RUNNING and job.status == "running"
    assert not job.finished and _job("done").finished
    assert set(UNFINISHED) == {"queued", "running"}


def test_an_unknown_status_is_an_error_where_the_record_is_made() -> None:
    with pytest.raises(ValueError, match="'paused' is not a valid JobStatus"):
        _job("paused")


def test_the_wire_schema_lists_exactly_the_statuses() -> None:
    schema = JobOut.model_json_schema()
    enum = schema["$defs"]["JobStatus"]["enum"]
    assert enum == [s.value for s in JobStatus]
