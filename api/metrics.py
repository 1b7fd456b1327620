"""Prometheus metrics (``GET /metrics``), one registry per app.

Requests are counted by route *template* (``/v1/plans/{plan_id}``, not each
id) so that the label set stays small.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
)
_SOLVE_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)


class Metrics:
    """The service's counters, gauges and histograms."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "mtf_planner_requests",
            "HTTP requests by route template, method and status code.",
            ("route", "method", "status"),
            registry=r,
        )
        self.latency = Histogram(
            "mtf_planner_request_duration_seconds",
            "HTTP request latency by route template.",
            ("route",),
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.solve = Histogram(
            "mtf_planner_solve_duration_seconds",
            "Wall time of one plan in a worker (load, solve, verify).",
            buckets=_SOLVE_BUCKETS,
            registry=r,
        )
        self.cache_hits = Counter(
            "mtf_planner_cache_hits",
            "Plan requests answered from the store.",
            registry=r,
        )
        self.cache_misses = Counter(
            "mtf_planner_cache_misses", "Plan requests that needed a solve.", registry=r
        )
        self.jobs = Counter(
            "mtf_planner_jobs_finished",
            "Jobs by final status.",
            ("status",),
            registry=r,
        )
        self.queue_depth = Gauge(
            "mtf_planner_queue_depth", "Jobs waiting for a worker.", registry=r
        )
        self.running = Gauge(
            "mtf_planner_jobs_running", "Jobs being solved.", registry=r
        )

    def track(self, queue_depth: Callable[[], int], running: Callable[[], int]) -> None:
        """Reads the gauges from the worker pool at scrape time."""
        self.queue_depth.set_function(queue_depth)
        self.running.set_function(running)


class MetricsMiddleware:
    """Counts every request and times it (pure ASGI: cheap on the hot path)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "<unmatched>"
            self.metrics.requests.labels(template, scope["method"], str(status)).inc()
            self.metrics.latency.labels(template).observe(time.perf_counter() - start)
