"""The planner service's client: :class:`PlannerClient`, and
``mtf.auto_layout``, which plans here or, given ``server=URL``, on a service.

The service (``mtf-planner serve``, :mod:`api.main`) answers with
``LayoutPlan.to_dict()``; :func:`plan_remote` rebuilds the same
:class:`~layout_planner.plan.LayoutPlan` that local planning returns (equal
but for the solver's timings and thread count).  The client lives beside the
service, not in the planner, because the planner knows nothing of HTTP.  It
imports neither FastAPI nor the service's modules, and httpx only when it
talks to a server, so planning locally through ``mtf.auto_layout`` (which
``mtf_core`` reaches through :mod:`mtf_core.extensions`) needs no web
packages installed.

>>> # client = PlannerClient("http://127.0.0.1:8080", token="...")
>>> # plan = mtf.auto_layout(graph, "x:2;y:4", outputs=[loss], server=client.base_url)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from api.redact import redact_url
from layout_planner import planner
from layout_planner.errors import PlannerError
from layout_planner.options import MeshTarget, PlanOptions, resolve_options
from layout_planner.plan import LayoutPlan
from mtf_core.errors import MtfError
from mtf_core.graph import Graph, Tensor
from mtf_core.serialization import graph_to_dict

if TYPE_CHECKING:
    import httpx

#: Environment variable with the bearer token ``auto_layout(server=...)`` sends.
TOKEN_ENV = "MTF_PLANNER_TOKEN"
#: Called with a job's phase and its fraction done (0..1).
Progress = Callable[[str, float], None]
_RETRY_STATUSES = (429, 502, 503, 504)


class RemotePlannerError(PlannerError):
    """The service rejected the request (a 4xx): ``status`` and its message."""

    def __init__(self, status: int, detail: str, error: str = "") -> None:
        super().__init__(f"planner service answered {status} ({error}): {detail}")
        self.status = status
        self.detail = detail
        self.error = error


class PlannerUnavailableError(MtfError, ConnectionError):
    """The service could not be reached or kept failing after the retries."""


class PlannerClient:
    """A small synchronous client for the planner service.

    Args:
      base_url: ``http://host:port``.
      token: bearer token for write endpoints (default: ``$MTF_PLANNER_TOKEN``).
      timeout_s: per-request timeout (connect and read).
      retries: extra attempts after a connection error, a timeout or a
        429/502/503/504 (POST /v1/plans is idempotent: same request, same plan).
      backoff_s: first wait between attempts, doubled each time (a
        ``Retry-After`` header wins).
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        timeout_s: float = 30.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(
            ("http://", "https://")
        ):
            shown = redact_url(base_url) if isinstance(base_url, str) else base_url
            raise PlannerError(
                f"server {shown!r} is not an http(s) URL; expected e.g. "
                "'http://127.0.0.1:8080'"
            )
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise PlannerError(f"retries is {retries!r}; expected an integer >= 0")
        import httpx

        self.base_url = base_url.rstrip("/")
        #: The URL fit to print: any password in it replaced by ``***``.
        self.shown_url = redact_url(self.base_url)
        try:
            url = httpx.URL(self.base_url)
            host, port = url.host, url.port
        except httpx.InvalidURL as e:
            host, port, why = "", None, str(e)
        else:
            why = "it names no host"
            if port is not None and not 0 < port < 65536:
                host, why = "", f"port {port} is not in 1..65535"
        if not host:
            raise PlannerError(
                f"server {redact_url(base_url)!r} is not a valid URL ({why}); "
                "expected e.g. 'http://127.0.0.1:8080'"
            )
        token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.retries = retries
        self.backoff_s = backoff_s
        self._http = httpx.Client(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout_s),
            headers=headers,
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PlannerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport ------------------------------------------------------------------------
    def request(
        self, method: str, path: str, json: Any = None, **params: Any
    ) -> httpx.Response:
        """One call with retries; raises RemotePlannerError for other 4xx/5xx."""
        import httpx

        wait = self.backoff_s
        last: str = ""
        for attempt in range(self.retries + 1):
            try:
                r = self._http.request(method, path, json=json, params=params or None)
            except (httpx.TransportError, httpx.TimeoutException) as e:
                last = f"{type(e).__name__}: {e}"
            else:
                if r.status_code not in _RETRY_STATUSES:
                    if r.status_code >= 400:
                        raise _error(r)
                    return r
                last = f"HTTP {r.status_code}: {r.text[:200]}"
                wait = _retry_after(r, wait)
            if attempt < self.retries:
                time.sleep(wait)
                wait *= 2
        raise PlannerUnavailableError(
            f"planner service {self.shown_url} failed {self.retries + 1} time(s) on "
            f"{method} {path}; last: {last}"
        )

    def request_json(
        self, method: str, path: str, json: Any = None, **params: Any
    ) -> dict[str, Any]:
        """:meth:`request`, then the response's JSON object."""
        return self._body(self.request(method, path, json=json, **params))

    def _body(self, r: httpx.Response, *keys: str) -> dict[str, Any]:
        """The answer's JSON object, which must have ``keys``; else a
        PlannerError saying the server does not answer like the planner."""
        try:
            body = r.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or any(k not in body for k in keys):
            want = "a JSON object" + (f" with {list(keys)}" if keys else "")
            raise PlannerError(
                f"{self.shown_url} answered {r.request.method} {r.request.url.path} "
                f"with HTTP {r.status_code} {r.text[:100]!r}, not {want}; is it a "
                "planner service (mtf-planner serve)?"
            )
        return body

    # -- endpoints ------------------------------------------------------------------------
    def plan(
        self,
        request: Mapping[str, Any],
        wait_s: float = 600.0,
        progress: Progress | None = None,
    ) -> dict[str, Any]:
        """POST /v1/plans; follows a 202 (a job) until it finishes or
        ``wait_s`` passes (``progress`` as in :meth:`wait_job`).  Returns
        ``PlanOut`` (``plan`` is the LayoutPlan dict)."""
        return self._planned("/v1/plans", request, wait_s, progress)

    def _planned(
        self,
        path: str,
        request: Mapping[str, Any],
        wait_s: float,
        progress: Progress | None,
    ) -> dict[str, Any]:
        """POSTs ``request`` to ``path``: the answer, or for a 202 (a job)
        the plan the job made (``GET path/<plan id>``) once it finishes."""
        r = self.request("POST", path, json=dict(request))
        if r.status_code == 202:
            job = self.wait_job(self._body(r, "id")["id"], wait_s, progress=progress)
            return self.request_json("GET", f"{path}/{job['plan_id']}")
        return self._body(r, "plan")

    def submit_job(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return self.request_json("POST", "/v1/jobs", json=dict(request))

    def get_job(self, job_id: str) -> dict[str, Any]:
        return self.request_json("GET", f"/v1/jobs/{job_id}")

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        return self.request_json("DELETE", f"/v1/jobs/{job_id}")

    def wait_job(
        self,
        job_id: str,
        wait_s: float = 600.0,
        poll_s: float = 0.2,
        progress: Progress | None = None,
    ) -> dict[str, Any]:
        """Polls a job until done; raises PlannerError if it failed or was
        cancelled, PlannerUnavailableError after ``wait_s``.  ``progress``
        is called with the job's phase and fraction done whenever a poll
        finds them changed."""
        deadline = time.monotonic() + wait_s
        seen: tuple[str, float] | None = None
        while True:
            job = self.get_job(job_id)
            if job["status"] == "done":
                return job
            if job["status"] in ("failed", "cancelled"):
                raise PlannerError(
                    f"planner job {job_id} {job['status']}: {job['error']}"
                )
            now = (str(job.get("phase") or job["status"]), job.get("progress") or 0.0)
            if progress is not None and now != seen:
                progress(*now)
                seen = now
            if time.monotonic() > deadline:
                raise PlannerUnavailableError(
                    f"planner job {job_id} is still {job['status']} ({job['phase']}) "
                    f"after {wait_s:g} s"
                )
            time.sleep(poll_s)
            poll_s = min(poll_s * 1.5, 2.0)

    def get_plan(self, plan_id: str) -> dict[str, Any]:
        return self.request_json("GET", f"/v1/plans/{plan_id}")

    def list_plans(self, limit: int = 50, offset: int = 0) -> dict[str, Any]:
        return self.request_json("GET", "/v1/plans", limit=limit, offset=offset)

    def evaluate(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return self.request_json("POST", "/v1/evaluate", json=dict(request))

    def scale_plan(
        self,
        request: Mapping[str, Any],
        wait_s: float = 600.0,
        progress: Progress | None = None,
    ) -> dict[str, Any]:
        """POST /v1/scale-plans (a ``ScalePlanRequest``: a Transformer's
        shape, ``devices``, ``hardware``, dtypes and fixed choices); follows a
        202 (a job) until it finishes or ``wait_s`` passes (``progress`` as
        in :meth:`wait_job`).  Returns ``ScalePlanOut``, whose ``plan`` has
        the mesh, micro-batches, schedule, dtypes, sharded weight classes,
        recomputation and the step's parts."""
        return self._planned("/v1/scale-plans", request, wait_s, progress)

    def get_scale_plan(self, plan_id: str) -> dict[str, Any]:
        return self.request_json("GET", f"/v1/scale-plans/{plan_id}")

    def list_scale_plans(self, limit: int = 50, offset: int = 0) -> dict[str, Any]:
        return self.request_json("GET", "/v1/scale-plans", limit=limit, offset=offset)

    def hardware(self) -> dict[str, Any]:
        return self.request_json("GET", "/v1/hardware")

    def health(self) -> dict[str, Any]:
        return self.request_json("GET", "/healthz")


def _error(r: httpx.Response) -> RemotePlannerError:
    try:
        body = r.json()
        return RemotePlannerError(
            r.status_code, str(body.get("detail")), str(body.get("error"))
        )
    except (ValueError, AttributeError):
        return RemotePlannerError(r.status_code, r.text[:500])


def _retry_after(r: httpx.Response, default: float) -> float:
    try:
        return max(0.0, min(float(r.headers.get("Retry-After", default)), 60.0))
    except ValueError:
        return default


def plan_request(
    graph: Graph,
    mesh_shape: MeshTarget,
    outputs: Sequence[Tensor] = (),
    options: PlanOptions | None = None,
) -> dict[str, Any]:
    """The POST /v1/plans body for ``auto_layout(graph, mesh_shape, outputs,
    options=options)``: the graph, the mesh (a shape, or a device count to
    search) and ``options.to_request_dict()``."""
    if not isinstance(graph, Graph):
        raise PlannerError(f"graph {graph!r} is not an mtf.Graph")
    options = PlanOptions() if options is None else options
    body: dict[str, Any] = {
        "graph": graph_to_dict(graph, outputs=list(outputs)),
        **options.to_request_dict(),
    }
    if isinstance(mesh_shape, int) and not isinstance(mesh_shape, bool):
        body["num_devices"] = mesh_shape
    else:
        body["mesh_shape"] = str(mesh_shape)
        del body["max_mesh_dims"]  # only a device count searches mesh shapes
    return body


def plan_remote(
    server: str | PlannerClient,
    graph: Graph,
    mesh_shape: MeshTarget,
    outputs: Sequence[Tensor] = (),
    options: PlanOptions | None = None,
) -> LayoutPlan:
    """``auto_layout`` on a planner service: the same arguments, the same plan.

    The server chooses the solver's threads and seed and verifies the plan
    itself; the plan is the same when the solve is proven optimal
    (``plan.status`` says so).
    """
    body = plan_request(graph, mesh_shape, outputs, options)
    if isinstance(server, PlannerClient):
        return LayoutPlan.from_dict(server.plan(body)["plan"])
    with PlannerClient(server) as client:
        return LayoutPlan.from_dict(client.plan(body)["plan"])


def auto_layout(
    graph: Graph,
    mesh_shape: MeshTarget,
    outputs: Sequence[Tensor] = (),
    *args: Any,
    server: str | PlannerClient | None = None,
    **kwargs: Any,
) -> LayoutPlan:
    """``mtf.auto_layout``: :func:`layout_planner.planner.auto_layout` (same
    arguments, see there), or, with ``server`` (a service URL or a
    :class:`PlannerClient`), the same request planned on that service; the
    plan is the same (``num_workers``, ``seed`` and ``verify`` are then the
    server's).

    >>> # plan = mtf.auto_layout(graph, "x:2;y:4", [loss], server="http://127.0.0.1:8080")
    """
    if server is None:
        return planner.auto_layout(graph, mesh_shape, outputs, *args, **kwargs)
    return plan_remote(
        server, graph, mesh_shape, outputs, resolve_options(*args, **kwargs)
    )
