"""``mtf-planner`` and ``mtf-train`` given careless input: one line on stderr
naming the value and what was expected, the documented exit code, no
traceback, no password; long work reports progress."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import httpx
import pytest
from api_cases import mlp_doc

from api.cli import EXIT_ERROR, EXIT_USAGE, main
from api.client import PlannerClient, PlannerUnavailableError
from layout_planner.errors import PlannerError

#: A Transformer that scale-plans in a few seconds on a slow host.
SMALL = [
    "scale", "--layers", "2", "--d-model", "64", "--heads", "4", "--d-kv", "16",
    "--d-ff", "256", "--vocab", "128", "--length", "32", "--batch", "8",
    "--devices", "4", "--time-limit", "2",
]  # fmt: skip

PROFILE = {
    "name": "cpu-host",
    "peak_flops": 1e11,
    "memory_bytes": 3 * 2**30,
    "hbm_bandwidth_bytes_per_s": 5.5e9,
    "default_link": {
        "name": "cpu-local",
        "bandwidth_bytes_per_s": 1e9,
        "latency_s": 1.5e-5,
    },
}


def _one_line_error(err: str, *named: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "error: " in lines[0], err
    assert "Traceback" not in err
    for text in named:
        assert text in lines[0], err


@pytest.fixture
def graph(tmp_path: Path) -> Path:
    path = tmp_path / "mlp.json"
    path.write_text(json.dumps(mlp_doc()))
    return path


# -- plan ----------------------------------------------------------------------------


def test_plan_refuses_a_device_count_whose_search_would_never_end(
    graph, monkeypatch, capsys
):
    # Factoring 10**12 by trial division never finished; planning must not start.
    import layout_planner.planner

    def never(*a, **k):
        raise AssertionError("planning started")

    monkeypatch.setattr(layout_planner.planner, "auto_layout", never)
    assert main(["plan", str(graph), "--devices", str(10**12)]) == EXIT_ERROR
    _one_line_error(capsys.readouterr().err, "--devices is 1000000000000", "1..")


@pytest.mark.parametrize(
    "field, text, named",
    [
        ("memory_bytes", "1e400", "memory_bytes is inf"),
        ("peak_flops", "1e-300", "peak_flops is 1e-300"),
        ("default_link", '{"name": "l", "bandwidth_bytes_per_s": 1e-300, '
         '"latency_s": 0}', "default_link.bandwidth_bytes_per_s is 1e-300"),
        ("default_link", '{"name": "l", "bandwidth_bytes_per_s": 1e9, '
         '"latency_s": NaN}', "latency_s is nan"),
    ],
)  # fmt: skip
def test_plan_names_an_out_of_range_number_in_a_hardware_file(
    graph, tmp_path, capsys, field, text, named
):
    # These overflowed the cost model or the solver's integer scaling: a traceback.
    doc = json.dumps({**PROFILE, field: "@"}).replace('"@"', text)
    hw = tmp_path / "hw.json"
    hw.write_text(doc)
    code = main(["plan", str(graph), "--mesh", "x:2", "--hardware", str(hw)])
    assert code == EXIT_ERROR
    _one_line_error(capsys.readouterr().err, repr(str(hw)), named)


def test_plan_names_a_hardware_file_that_is_not_json(graph, tmp_path, capsys):
    hw = tmp_path / "hw.json"
    hw.write_text("{bad")
    assert main(["plan", str(graph), "--mesh", "x:2", "--hardware", str(hw)]) == 1
    _one_line_error(capsys.readouterr().err, repr(str(hw)))


def test_plan_says_a_binary_graph_file_is_not_utf8(tmp_path, capsys):
    path = tmp_path / "g.json"
    path.write_bytes(b"\x7fELF\x02\x01\x01\x00\xff\xfe\xd0")
    assert main(["plan", str(path), "--mesh", "x:2"]) == EXIT_ERROR
    _one_line_error(capsys.readouterr().err, "not UTF-8")


@pytest.mark.parametrize(
    "server, named",
    [
        ("http://[::1", "is not a valid URL"),
        ("http://", "names no host"),
        ("http://127.0.0.1:99999", "port 99999"),
        ("http://me:s3cret@[::1", "me:***@"),
        ("me:s3cret@host:8080", "is not an http(s) URL"),
    ],
)
def test_plan_names_a_malformed_server_url(graph, capsys, server, named):
    code = main(["plan", str(graph), "--mesh", "x:2", "--server", server])
    assert code == EXIT_ERROR
    err = capsys.readouterr().err
    _one_line_error(err, named)
    assert "s3cret" not in err


# -- the client ----------------------------------------------------------------------


def test_an_unreachable_server_is_named_without_its_password():
    from api.redact import redact_url

    with PlannerClient("http://me:s3cret@127.0.0.1:1", retries=0) as c:
        with pytest.raises(PlannerUnavailableError) as e:
            c.health()
    assert "me:***@127.0.0.1:1" in str(e.value) and "s3cret" not in str(e.value)
    assert redact_url("http://u:pw@h/?next=http://x") == "http://u:***@h/?next=http://x"


@pytest.mark.parametrize("body", [b"{}", b"[1, 2]", b"<html>hi</html>"])
@pytest.mark.parametrize("endpoint", ["plan", "scale_plan"])
def test_a_server_that_is_not_the_planner_is_a_planner_error(body, endpoint):
    # It was a KeyError or TypeError from the CLI (a traceback).
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body))
    with PlannerClient("http://other:8080", transport=transport, retries=0) as c:
        with pytest.raises(PlannerError, match="is it a planner service"):
            getattr(c, endpoint)({})


def test_waiting_on_a_job_reports_each_new_phase():
    # A scale plan on a service ran for minutes with nothing on the screen.
    states = iter(
        [
            {"status": "queued", "phase": None, "progress": None},
            {"status": "running", "phase": "mesh 1 of 3", "progress": 0.1},
            {"status": "running", "phase": "mesh 1 of 3", "progress": 0.1},
            {"status": "running", "phase": "mesh 2 of 3", "progress": 0.4},
            {"status": "done", "plan_id": "p1"},
        ]
    )

    def answer(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(202, json={"id": "j1"})
        if request.url.path == "/v1/jobs/j1":
            return httpx.Response(200, json=next(states))
        assert request.url.path == "/v1/scale-plans/p1"
        return httpx.Response(200, json={"id": "p1", "plan": {"fits": True}})

    seen: list[tuple[str, float]] = []
    transport = httpx.MockTransport(answer)
    with PlannerClient("http://planner", transport=transport, retries=0) as c:
        out = c.scale_plan({}, progress=lambda *a: seen.append(a))
    assert out["plan"] == {"fits": True}
    assert seen == [("queued", 0.0), ("mesh 1 of 3", 0.1), ("mesh 2 of 3", 0.4)]


# -- scale ---------------------------------------------------------------------------


def test_scale_reports_progress_on_stderr_unless_quiet(capsys):
    assert main(SMALL) == 0
    captured = capsys.readouterr()
    assert "planned on this machine" in captured.out
    assert "mtf-planner scale: [  0%] mesh 1 of " in captured.err
    assert main([*SMALL, "--quiet"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "extra, named",
    [
        (["--stages", "0"], "--stages is 0"),
        (["--layers", "0"], "--layers is 0"),
        (["--time-limit", "nan"], "--time-limit is nan"),
        (["--micro-batches", "-2"], "--micro-batches is -2"),
    ],
)
def test_scale_names_the_option_of_a_bad_number(capsys, extra, named):
    assert main([*SMALL, *extra]) == EXIT_ERROR
    _one_line_error(capsys.readouterr().err, named)


# -- export --------------------------------------------------------------------------


def test_export_too_large_to_build_is_one_line(monkeypatch, capsys):
    # --vocab 10**12 made numpy raise MemoryError (7.28 TiB): a traceback.
    import api.examples

    def huge(*a, **k):
        raise MemoryError("Unable to allocate 7.28 TiB for an array")

    monkeypatch.setattr(api.examples, "example_graph", huge)
    code = main(["export", "--model", "transformer-lm", "--vocab", str(10**12)])
    assert code == EXIT_ERROR
    _one_line_error(capsys.readouterr().err, "out of memory", "7.28 TiB")


def test_what_export_writes_at_length_2048_plan_reads(tmp_path, capsys):
    # The causal bias was written as 4,194,304 numbers, which plan refused.
    out = tmp_path / "lm.json"
    argv = ["export", "--model", "transformer-lm", "--length", "2048", "-o", str(out)]
    assert main(argv) == 0
    assert out.stat().st_size < 1_000_000
    assert main(["plan", str(out), "--mesh", "x:8"]) == 0
    assert "batch (8) -> x" in capsys.readouterr().out


# -- serve and seed ------------------------------------------------------------------


@pytest.mark.parametrize("port", ["99999", "-1", "0"])
def test_serve_refuses_a_port_that_is_not_a_tcp_port(port, monkeypatch, capsys):
    # 99999 served on 34463 (99999 mod 65536) while printing :99999.
    import uvicorn

    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: pytest.fail("served"))
    with pytest.raises(SystemExit) as e:
        main(["serve", "--port", port])
    assert e.value.code == EXIT_USAGE
    assert f"argument --port: {port} is not a TCP port" in capsys.readouterr().err


def test_serve_option_out_of_range_is_one_line(tmp_path, capsys):
    code = main(["serve", "--workers", "0", "--data-dir", str(tmp_path)])
    assert code == EXIT_ERROR
    _one_line_error(capsys.readouterr().err, "--workers is 0")


@pytest.mark.parametrize("command", ["serve", "seed"])
def test_an_unusable_sqlite_store_is_one_line_before_serving(
    command, tmp_path, monkeypatch, capsys
):
    # It was a traceback from uvicorn's startup, and exit 3.
    import uvicorn

    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: pytest.fail("served"))
    (tmp_path / "planner.sqlite3").write_text("not a database")
    assert main([command, "--data-dir", str(tmp_path)]) == EXIT_ERROR
    _one_line_error(capsys.readouterr().err, "planner.sqlite3", "not a database")
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    assert main([command, "--data-dir", str(not_a_dir)]) == EXIT_ERROR
    _one_line_error(capsys.readouterr().err, str(not_a_dir))


def test_seed_on_an_unreachable_database_is_one_line_without_its_password(capsys):
    pytest.importorskip("psycopg")
    url = "postgresql://planner:s3cret@127.0.0.1:1/plans"
    assert main(["seed", "--database-url", url]) == EXIT_ERROR
    out, err = capsys.readouterr()
    _one_line_error(err, "planner:***@127.0.0.1:1", "OperationalError")
    assert "s3cret" not in out + err


# -- calibrate -----------------------------------------------------------------------


@pytest.mark.parametrize("where", ["dir", "missing/x.json"])
def test_calibrate_checks_its_output_before_measuring(
    where, tmp_path, monkeypatch, capsys
):
    # Minutes of measuring were lost when -o could not be written at the end.
    import api.calibrate_cli

    def measure(*a, **k):
        raise AssertionError("measured before checking -o")

    monkeypatch.setattr(api.calibrate_cli.subprocess, "Popen", measure)
    (tmp_path / "dir").mkdir()
    out = tmp_path / where
    assert main(["calibrate", "--devices", "2", "-o", str(out)]) == EXIT_ERROR
    _one_line_error(capsys.readouterr().err, repr(str(out)))


# -- mtf-train -----------------------------------------------------------------------


@pytest.fixture
def no_slow_work(monkeypatch):
    """``mtf-train`` fails if it gets to TensorFlow or a checkpoint before
    its options are checked (without importing TensorFlow here)."""
    from mtf_core.train import cli

    def slow(*a, **k):
        raise AssertionError("slow work started before the options were checked")

    devices = types.ModuleType("mtf_core.lowering.devices")
    devices.logical_cpu_devices = slow  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mtf_core.lowering.devices", devices)
    monkeypatch.setattr(cli, "load_checkpoint", slow)
    return cli


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--steps", "0"], "--steps is 0"),
        (["--steps", "-1"], "--steps is -1"),
        (["--devices", "0"], "--devices is 0"),
        (["--save_every", "0"], "--save_every is 0"),
        (["--corpus_bytes", "-5"], "--corpus_bytes is -5"),
        (["--config", "{tmp}/missing.json"], "No such file"),
        (["--config", "{tmp}/bad.json"], "is not valid JSON"),
        (["--config", "{tmp}/list.json"], "holds a JSON list"),
        (["--config", "{tmp}/neg.json"], "d_model must be a positive integer"),
        (["--checkpoint_dir", "{tmp}/bad.json"], "cannot make the directory"),
        (["--tensorboard", "{tmp}/bad.json/tb"], "cannot make the directory"),
        (["--learning_rate", "nan"], "learning_rate"),
        (["sample", "--checkpoint_dir", "{tmp}", "--temperature", "nan"],
         "--temperature is nan"),
        (["sample", "--checkpoint_dir", "{tmp}", "--max_new_tokens", "-5"],
         "--max_new_tokens is -5"),
    ],
)  # fmt: skip
def test_mtf_train_checks_its_options_before_any_slow_work(
    no_slow_work, tmp_path, capsys, argv, named
):
    (tmp_path / "bad.json").write_text("{bad")
    (tmp_path / "list.json").write_text("[1]")
    (tmp_path / "neg.json").write_text('{"d_model": -3}')
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    extra = [] if argv[0] == "sample" else ["--no_progress"]
    assert no_slow_work.main([*argv, *extra]) == 2
    _one_line_error(capsys.readouterr().err, named)


def test_mtf_train_reads_its_config_file_once(tmp_path, monkeypatch):
    """The model the run builds is the one the options' check read, even if
    the file changes in between (it is read once)."""
    from mtf_core.train import cli

    path = tmp_path / "model.json"
    path.write_text('{"d_model": 64, "num_layers": 1}')
    reads = []
    read = cli._config_file
    monkeypatch.setattr(cli, "_config_file", lambda p: reads.append(p) or read(p))
    args = cli.parse_args(["--config", str(path), "--no_progress"])
    cli._check_options(args)
    path.write_text('{"d_model": 32}')
    cfg = cli.model_config(args, 50)
    assert reads == [str(path)]
    assert (cfg.d_model, cfg.num_layers, cfg.vocab) == (64, 1, 50)
