"""Reporting a measured step to the planner service (``mtf.report_measurement``).

``mtf_core`` measures (:mod:`mtf_core.train.measurement`) but speaks no HTTP;
this function, declared as the ``mtf`` extension ``report_measurement``,
sends the measurement to ``POST /v1/measurements`` with the planner client.
"""

from __future__ import annotations

from typing import Any

from api.client import PlannerClient


def report_measurement(
    server: str,
    plan_id: str,
    measurement: Any,
    token: str | None = None,
    source: str = "",
    transport: Any = None,
) -> dict[str, Any]:
    """POSTs ``measurement`` (a ``StepMeasurement``, or a ready body dict) for
    plan ``plan_id``; returns the service's answer: the stored measurement,
    the plan's prediction and the refitted profile's prediction."""
    body = (
        dict(measurement)
        if isinstance(measurement, dict)
        else measurement.report_body(plan_id, source)
    )
    body["plan_id"] = plan_id
    with PlannerClient(server, token=token, transport=transport) as client:
        return client.request_json("POST", "/v1/measurements", json=body)
