"""``mtf.auto_layout(..., server=URL)``, PlannerClient (timeouts, retries,
errors) and the ``mtf-planner`` CLI, against a real server on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest
from api_cases import ServerThread, free_port, mlp_doc, service_settings

import mtf_core as mtf
from api.cli import EXIT_NOTHING_FITS, EXIT_OK, main
from api.client import (
    PlannerClient,
    PlannerUnavailableError,
    RemotePlannerError,
)

pytestmark = pytest.mark.solver


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    with ServerThread(service_settings(tmp_path_factory.mktemp("client"))) as s:
        yield s


@pytest.fixture(scope="module")
def model() -> mtf.LoadedGraph:
    return mtf.graph_from_dict(mlp_doc(hidden=128, batch=64))


@pytest.mark.parametrize("mesh", ["x:2;y:2", 4])
def test_auto_layout_on_a_server_returns_the_same_plan_as_local_planning(
    server, model, mesh
):
    kw = dict(outputs=model.outputs, hardware="tpu-v4", top_k=3)
    remote = mtf.auto_layout(model.graph, mesh, server=server.url, **kw)
    local = mtf.auto_layout(model.graph, mesh, **kw)
    assert replace(remote, solver=local.solver) == local
    assert remote.solver.status == local.solver.status
    assert remote.explain() == local.explain()


class FlakyTransport(httpx.BaseTransport):
    """Fails the first ``failures`` requests as a dropped connection would,
    then forwards to the real server."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0
        self.real = httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        if self.calls <= self.failures:
            raise httpx.ConnectError("connection refused", request=request)
        return self.real.handle_request(request)


def test_client_retries_dropped_connections_then_succeeds(server):
    transport = FlakyTransport(failures=2)
    with PlannerClient(
        server.url, retries=2, backoff_s=0.01, transport=transport
    ) as client:
        assert client.health()["status"] == "ok"
    assert transport.calls == 3


def test_client_gives_up_after_its_retries(server):
    transport = FlakyTransport(failures=10)
    with PlannerClient(
        server.url, retries=1, backoff_s=0.01, transport=transport
    ) as client:
        with pytest.raises(PlannerUnavailableError, match="failed 2 time"):
            client.hardware()
    assert transport.calls == 2


def test_unreachable_server_is_a_connection_error():
    url = f"http://127.0.0.1:{free_port()}"
    with PlannerClient(url, retries=1, backoff_s=0.01, timeout_s=2) as client:
        with pytest.raises(ConnectionError, match="ConnectError"):
            client.health()


def test_client_raises_the_servers_message_for_a_bad_request(server, model):
    with PlannerClient(server.url) as client:
        with pytest.raises(
            RemotePlannerError, match="mesh_shape 'x:0' is invalid"
        ) as info:
            client.plan({"graph": mlp_doc(), "mesh_shape": "x:0"})
    assert info.value.status == 422
    with pytest.raises(ValueError, match="not an http"):
        PlannerClient("127.0.0.1:8080")


def test_cli_exports_a_model_and_plans_it_locally_and_on_the_server(
    server, tmp_path, capsys
):
    path = tmp_path / "mlp.json"
    args = [
        "export",
        "--model",
        "mlp",
        "--layers",
        "1",
        "--hidden",
        "64",
        "--batch",
        "32",
    ]
    assert main([*args, "-o", str(path)]) == EXIT_OK
    doc = json.loads(path.read_text())
    assert doc["format"] == "mtf-graph" and doc["metadata"]["name"] == "mlp"
    capsys.readouterr()

    assert (
        main(["plan", str(path), "--mesh", "x:2;y:2", "--hardware", "tpu-v4"])
        == EXIT_OK
    )
    local = capsys.readouterr().out
    assert (
        main(
            [
                "plan",
                str(path),
                "--mesh",
                "x:2;y:2",
                "--hardware",
                "tpu-v4",
                "--server",
                server.url,
            ]
        )
        == EXIT_OK
    )
    remote = capsys.readouterr().out
    # The same table, but for where it was planned.
    assert local.splitlines()[1:] == remote.splitlines()[1:]
    assert "layout rules:" in local and "#1" in local and "fits" in local

    assert (
        main(["plan", str(path), "--devices", "4", "--json", "--server", server.url])
        == EXIT_OK
    )
    plan = json.loads(capsys.readouterr().out)
    assert [t["mesh_shape"] for t in plan["mesh_trials"]] == ["x:4", "x:2;y:2"]


def test_cli_plan_exits_non_zero_when_nothing_fits(server, tmp_path, capsys):
    path = tmp_path / "mlp.json"
    path.write_text(json.dumps(mlp_doc()))
    for extra in ([], ["--server", server.url]):
        code = main(
            [
                "plan",
                str(path),
                "--mesh",
                "x:2",
                "--max-memory-fraction",
                "1e-9",
                *extra,
            ]
        )
        assert code == EXIT_NOTHING_FITS
        out = capsys.readouterr().out
        assert "DOES NOT FIT" in out and "nothing fits in" in out


def test_cli_reports_bad_input_with_exit_code_1(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text('{"format": "mtf-graph", "version": 7}')
    assert main(["plan", str(path), "--mesh", "x:2"]) == 1
    assert "version" in capsys.readouterr().err
    assert main(["export", "--model", "resnet"]) == 1
    assert "unknown model 'resnet'" in capsys.readouterr().err


def test_cli_exports_the_mnist_example(capsys):
    assert main(["export", "--model", "mnist", "--batch", "16"]) == EXIT_OK
    doc = json.loads(capsys.readouterr().out)
    names = {
        d["name"] for op in doc["operations"] for o in op["outputs"] for d in o["shape"]
    }
    assert {"batch", "rows", "cols", "hidden", "classes"} <= names


def test_service_cli_and_client_never_load_tensorflow(tmp_path):
    # A fresh interpreter: this test process may have TensorFlow loaded by others.
    code = f"""
import sys
from api.cli import main
from api.main import create_app
import api.client
assert main(["export", "--model", "mnist", "-o", {str(tmp_path / "g.json")!r}]) == 0
assert main(["plan", {str(tmp_path / "g.json")!r}, "--mesh", "x:2"]) == 0
create_app()
print("tensorflow" in sys.modules)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_cli_plan_help_lists_its_exit_codes(capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for code, meaning in (
        (0, "the plan fits in memory"),
        (1, "bad input"),
        (2, "usage error"),
        (3, "nothing fits in memory"),
    ):
        assert f"  {code}  {meaning}" in out


def test_cli_default_time_limit_is_the_services(capsys):
    from api.cli import _parser
    from api.schemas import PlanRequest

    args = _parser().parse_args(["plan", "g.json", "--mesh", "x:2"])
    assert args.time_limit == PlanRequest.model_fields["time_limit_s"].default == 10.0


def test_cli_prints_the_mesh_shape_as_the_user_wrote_it(tmp_path, capsys):
    path = tmp_path / "mlp.json"
    path.write_text(json.dumps(mlp_doc()))
    assert main(["plan", str(path), "--mesh", "x:2;y:2", "--time-limit", "5"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert "on mesh [x:2;y:2]," in head and "x:2,y:2" not in head
    assert main(["plan", str(path), "--devices", "2"]) == 0
    assert "on mesh [x:2]," in capsys.readouterr().out


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.5", "::"])
def test_cli_serve_refuses_open_writes_on_a_public_address(host, tmp_path, capsys):
    # Refused before anything starts (no uvicorn, no store).
    code = main(["serve", "--host", host, "--data-dir", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err
    assert "MTF_PLANNER_API_TOKENS" in err and "--insecure" in err
    assert not (tmp_path / "planner.sqlite3").exists()


def _plans_answered(url: str, status: int) -> float:
    """POST /v1/plans answers with ``status`` so far, from the server's metrics."""
    want = f'mtf_planner_requests_total{{method="POST",route="/v1/plans",status="{status}"}}'
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(want):
            return float(line.split()[-1])
    return 0.0


def test_client_sends_a_bad_hardware_profile_once_and_raises_the_422(server):
    # A bandwidth of 1e-300 once failed inside the solver as a 503, which the
    # client retried; it is the request's fault, answered 422, never retried.
    from cost_models.hardware import PRESETS

    hw = PRESETS["tpu-v4"].to_dict()
    hw["default_link"] = {**hw["default_link"], "bandwidth_bytes_per_s": 1e-300}
    before = _plans_answered(server.url, 422)
    with PlannerClient(server.url, retries=3) as client:
        with pytest.raises(RemotePlannerError, match="bandwidth_bytes_per_s") as info:
            client.plan({"graph": mlp_doc(), "mesh_shape": "x:2", "hardware": hw})
    assert info.value.status == 422
    assert _plans_answered(server.url, 422) == before + 1
