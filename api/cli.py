"""``mtf-planner``: serve the planner, plan a graph file, export example graphs.

    mtf-planner serve --host 127.0.0.1 --port 8080 --data-dir .data
    mtf-planner export --model transformer-lm --layers 2 -o lm.json
    mtf-planner plan lm.json --mesh "x:2;y:4" --hardware h100-nvlink-ib \\
        [--server http://127.0.0.1:8080] [--max-memory-fraction 0.9] [--json]
    mtf-planner seed --data-dir .data
    mtf-planner calibrate --devices 8 -o cpu8.json
    mtf-planner scale --layers 4 --d-model 1024 ... --devices 8 [--server URL]

``plan`` exits 0 when the plan fits in memory, 3 when nothing fits (or no
layout was found): a CI step fails when a model change stops fitting the
target mesh.  1 is a bad input or an unreachable server, 2 a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from api import calibrate_cli, scale_cli
from layout_planner.options import DEFAULT_TIME_LIMIT_S

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOTHING_FITS = 3

_PLAN_EXIT_CODES = f"""exit codes:
  {EXIT_OK}  the plan fits in memory
  {EXIT_ERROR}  bad input (graph, mesh, hardware), or the server refused or could not be reached
  {EXIT_USAGE}  usage error (unknown option, missing argument)
  {EXIT_NOTHING_FITS}  nothing fits in memory, or the solver found no layout
"""

#: Hosts ``serve`` may bind without API tokens (open writes reach only this machine).
_LOOPBACK = ("127.0.0.1", "::1", "localhost")

#: Size options of ``export`` (``--d-model`` on the command line), passed on to
#: :func:`api.examples.example_graph`.
_MODEL_SIZES = (
    "layers",
    "d_model",
    "heads",
    "d_kv",
    "d_ff",
    "vocab",
    "length",
    "batch",
    "hidden",
    "features",
    "classes",
)


def _port(text: str) -> int:
    """``--port``: a TCP port (a larger number would wrap around in the
    socket layer and serve on another port than the one printed)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port; expected 1..65535")
    return port


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mtf-planner", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the planner service (uvicorn)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=_port, default=8080)
    s.add_argument("--data-dir", help="where the SQLite store lives")
    s.add_argument("--database-url", help="postgresql://... instead of SQLite")
    s.add_argument("--workers", type=int, help="solve worker processes")
    s.add_argument("--access-log", action="store_true", help="log every request")
    s.add_argument(
        "--insecure",
        action="store_true",
        help="serve on a non-loopback address without API tokens "
        "(MTF_PLANNER_API_TOKENS): anyone who can reach it may plan",
    )

    pl = sub.add_parser(
        "plan",
        help="plan a graph file (locally or on a server)",
        epilog=_PLAN_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    pl.add_argument("graph", help="a graph JSON file (mtf-planner export writes one)")
    where = pl.add_mutually_exclusive_group(required=True)
    where.add_argument("--mesh", help="mesh shape, e.g. 'x:2;y:4'")
    where.add_argument("--devices", type=int, help="a device count: search mesh shapes")
    pl.add_argument(
        "--hardware", default="cpu-host", help="preset name or profile .json"
    )
    pl.add_argument("--objective", choices=("time", "memory"), default="time")
    pl.add_argument(
        "--max-memory-fraction", type=float, help="plan for this fraction of memory"
    )
    pl.add_argument("--top-k", type=int, default=5)
    pl.add_argument(
        "--time-limit",
        type=float,
        default=DEFAULT_TIME_LIMIT_S,
        help="solver seconds (default %(default)g, as the service's)",
    )
    pl.add_argument("--server", help="plan on this planner service (http://host:port)")
    pl.add_argument("--token", help="API token for the server (or $MTF_PLANNER_TOKEN)")
    pl.add_argument(
        "--no-measurements",
        action="store_true",
        help="with --server: plan with the preset as shipped, not refitted from "
        "the steps the service measured",
    )
    pl.add_argument("--json", action="store_true", help="print the plan as JSON")

    e = sub.add_parser("export", help="write an example model's graph JSON")
    e.add_argument(
        "--model", required=True, help="transformer-lm, encoder-decoder, mlp, mnist"
    )
    e.add_argument("--optimizer", default="adam")
    for size in _MODEL_SIZES:
        e.add_argument(f"--{size.replace('_', '-')}", type=int)
    e.add_argument("-o", "--output", default="-", help="file to write ('-': stdout)")

    sd = sub.add_parser("seed", help="store plans for the example models")
    sd.add_argument("--data-dir")
    sd.add_argument("--database-url")
    calibrate_cli.add_parser(sub)
    scale_cli.add_parser(sub)
    return p


def _settings(args: argparse.Namespace) -> Any:
    from api.settings import Settings

    overrides = {
        k: v
        for k, v in (
            ("data_dir", getattr(args, "data_dir", None)),
            ("database_url", getattr(args, "database_url", None)),
            ("workers", getattr(args, "workers", None)),
        )
        if v is not None
    }
    from pydantic import ValidationError

    try:
        return Settings(**overrides)
    except ValidationError as e:  # one line, naming the option or variable
        err = e.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else ""
        where = (
            f"--{field.replace('_', '-')}"
            if field in overrides
            else f"MTF_PLANNER_{field.upper()}"
        )
        got = "" if field in _SECRET_SETTINGS else f" is {err.get('input')!r}"
        raise ValueError(f"{where}{got}: {err['msg']}") from None


#: Settings whose values are never printed.
_SECRET_SETTINGS = ("api_tokens", "database_url")


def _database_errors() -> tuple[type[BaseException], ...]:
    """What opening or using the store raises when its database is not usable
    (neither ValueError nor OSError): sqlite3's, and psycopg's if installed."""
    import sqlite3

    errors: list[type[BaseException]] = [sqlite3.Error]
    try:
        import psycopg
    except ImportError:
        pass
    else:
        errors.append(psycopg.Error)
    return tuple(errors)


def _database_error(settings: Any, error: BaseException) -> ValueError:
    """``error`` as one line naming the store (never its password)."""
    import urllib.parse

    text = "; ".join(x.strip() for x in str(error).splitlines() if x.strip())
    try:
        password = urllib.parse.urlsplit(settings.database_url.strip()).password
    except ValueError:
        password = None
    if password:
        text = text.replace(password, "***")
    return ValueError(
        f"the store {settings.store_description} is not usable: "
        f"{type(error).__name__}: {text}"
    )


def _check_store(settings: Any) -> None:
    """Opens the store and closes it again, so that a data dir that cannot
    be written or a database that does not answer fails here, in one line,
    rather than in a traceback from the server's startup."""
    from api.store import open_store

    try:
        open_store(settings).close()
    except _database_errors() as e:
        raise _database_error(settings, e) from None


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from api.main import create_app

    settings = _settings(args)
    if args.host not in _LOOPBACK and not settings.tokens and not args.insecure:
        print(
            f"mtf-planner serve: error: --host {args.host} is reachable from other "
            "machines and no API tokens are set, so anyone could plan on this "
            "service; set MTF_PLANNER_API_TOKENS=token1,token2 (clients send "
            "'Authorization: Bearer <token>'), or pass --insecure to serve open "
            "writes anyway",
            file=sys.stderr,
        )
        return EXIT_USAGE
    _check_store(settings)
    if not settings.tokens:
        print(
            "mtf-planner serve: warning: no API tokens; planning is open to "
            + (
                "anyone who can reach this address" if args.insecure else "this machine"
            ),
            file=sys.stderr,
            flush=True,
        )
    where = settings.store_description  # no password
    print(
        f"mtf-planner: store {where}; dashboard http://{args.host}:{args.port}/",
        flush=True,
    )
    uvicorn.run(
        create_app(settings),
        host=args.host,
        port=args.port,
        access_log=args.access_log,
        log_level="info",
    )
    return EXIT_OK


def cmd_seed(args: argparse.Namespace) -> int:
    from api.seed import seed

    settings = _settings(args)
    print(f"seeding {settings.store_description} with example plans:")
    try:
        seed(settings)
    except _database_errors() as e:
        raise _database_error(settings, e) from None
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    from api.examples import example_graph

    sizes = {k: getattr(args, k) for k in _MODEL_SIZES}
    doc = example_graph(args.model, optimizer=args.optimizer, **sizes)
    text = json.dumps(doc, allow_nan=False)
    if args.output == "-":
        sys.stdout.write(text + "\n")
    else:
        Path(args.output).write_text(text + "\n")
        print(
            f"wrote {args.output}: {args.model}, {len(doc['operations'])} operations",
            file=sys.stderr,
        )
    return EXIT_OK


def _hardware(value: str) -> Any:
    """A preset's name, or the profile in the .json file ``value`` as a dict,
    checked against the ranges the service accepts (a bandwidth of 1e-300
    would overflow the cost model)."""
    from pydantic import ValidationError

    from api.schemas import HardwareIn
    from cost_models.hardware import PRESETS
    from cost_models.profiles import get_hardware

    if value in PRESETS:
        return value
    if not (value.endswith(".json") and os.path.isfile(value)):
        return get_hardware(value).to_dict()  # says what it expected

    try:
        profile = get_hardware(value).to_dict()  # a profile .json on this machine
        HardwareIn.model_validate(profile)
    except ValidationError as e:
        err = e.errors()[0]
        raise ValueError(
            f"hardware profile {value!r}: {'.'.join(map(str, err['loc']))} is "
            f"{err.get('input')!r}: {err['msg']}"
        ) from None
    except (ValueError, TypeError) as e:  # HardwareProfile's own checks
        raise ValueError(f"hardware profile {value!r}: {e}") from None
    return profile


def _devices(n: int | None) -> int | None:
    """``--devices``, within what the service's requests allow (the mesh
    search factors it by trial division: 10**12 would never finish)."""
    from api.schemas import RANGES

    lo, hi = (int(x) for x in RANGES["num_devices"])
    if n is not None and not lo <= n <= hi:
        raise ValueError(f"--devices is {n}; expected a device count in {lo}..{hi}")
    return n


def cmd_plan(args: argparse.Namespace) -> int:
    from cost_models.profiles import get_hardware
    from layout_planner.plan import LayoutPlan
    from mtf_core.serialization import graph_from_json

    devices = _devices(args.devices)
    text = Path(args.graph).read_bytes()  # the reader says if it is not UTF-8
    hardware = _hardware(args.hardware)
    memory_limit = None
    if args.max_memory_fraction is not None:
        if not 0 < args.max_memory_fraction <= 1:
            raise ValueError(
                f"--max-memory-fraction is {args.max_memory_fraction}; expected a "
                "number in (0, 1]"
            )
        memory_limit = max(
            1, int(get_hardware(hardware).memory_bytes * args.max_memory_fraction)
        )
    mesh: Any = args.mesh if args.mesh is not None else devices
    from layout_planner.options import PlanOptions

    options = PlanOptions(
        hardware=get_hardware(hardware),
        objective=args.objective,
        memory_limit_bytes=memory_limit,
        top_k=args.top_k,
        time_limit_s=args.time_limit,
    )
    if args.server:
        from api.client import PlannerClient, plan_request
        from api.redact import redact_url

        loaded = graph_from_json(text)
        body = plan_request(loaded.graph, mesh, loaded.outputs, options)
        if args.no_measurements:
            body["use_measurements"] = False
        with PlannerClient(args.server, token=args.token) as client:
            out = client.plan(body)
        plan_dict = out["plan"]
        plan = LayoutPlan.from_dict(plan_dict)
        where = (
            f"{redact_url(args.server)} (plan {out.get('id')}"
            f"{', cached' if out.get('cached') else ''})"
        )
        if out.get("profile"):
            where += f"; profile: {out['profile']['text']}"
    else:
        from layout_planner.planner import auto_layout

        loaded = graph_from_json(text)
        plan = auto_layout(loaded.graph, mesh, loaded.outputs, options=options)
        plan_dict = plan.to_dict()
        where = "this machine"
    if args.json:
        from mtf_core.serialization.schema import json_safe

        print(json.dumps(json_safe(plan_dict, "plan"), indent=2))
    else:
        print(format_plan(plan, args.graph, where, mesh_text=args.mesh))
    return EXIT_OK if plan.ok else EXIT_NOTHING_FITS


def user_mesh(mesh_shape: Any, given: str | None = None) -> str:
    """A mesh shape as the user writes it: ``given`` (the ``--mesh`` text) when
    it is that shape, else ``x:2;y:4`` (the planner prints ``x:2,y:4``).

    >>> user_mesh("x:2,y:4"), user_mesh("x:2,y:4", " x:2 ; y:4 ")
    ('x:2;y:4', 'x:2 ; y:4')
    """
    canonical = str(mesh_shape)
    if given is not None:
        from mtf_core.shapes import convert_to_shape

        try:
            if str(convert_to_shape(given)) == canonical:
                return given.strip()
        except ValueError:
            pass
    return canonical.replace(",", ";")


def format_plan(
    plan: Any, graph_name: str, where: str, mesh_text: str | None = None
) -> str:
    """The plan as a text table (what ``mtf-planner plan`` prints); the mesh
    shape as the user wrote it (``mesh_text``)."""
    from layout_planner.plan import fmt_bytes, fmt_s

    c = plan.cost
    lines = [
        f"graph {graph_name} on mesh [{user_mesh(plan.mesh_shape, mesh_text)}], "
        f"{plan.hardware.name}, "
        f"objective {plan.objective.value}: {plan.status.value}, planned on {where}",
        f"layout rules: {plan.layout_rules or '(nothing split)'}",
        f"step time {fmt_s(c.time_s)} (compute {fmt_s(c.compute_s)}"
        + "".join(f", {a}: {fmt_s(s)}" for a, s in c.comm_s_by_axis)
        + f"); peak memory {fmt_bytes(c.peak_memory_bytes)} of "
        f"{fmt_bytes(c.memory_capacity_bytes)} per device: "
        + ("fits" if c.fits else "DOES NOT FIT"),
    ]
    if plan.reason:
        lines.append(plan.reason)
    rows: list[tuple[str, ...]] = [
        ("", "layout rules", "step time", "comm", "peak memory", "fits")
    ]
    for cand in plan.candidates:
        rows.append(_row(f"#{cand.rank}", str(cand.layout_rules), cand.cost))
    for b in plan.baselines:
        if b.cost is not None:
            rows.append(_row(b.name, str(b.layout_rules), b.cost))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines.append("")
    for r in rows:
        lines.append(
            "  ".join(
                v.rjust(w) if i >= 2 else v.ljust(w)
                for i, (v, w) in enumerate(zip(r, widths))
            ).rstrip()
        )
    if plan.dims:
        lines.append("")
        lines.extend(plan.explain().splitlines()[2 + bool(plan.reason) :])
    return "\n".join(lines)


def _row(name: str, rules: str, cost: Any) -> tuple[str, ...]:
    from layout_planner.plan import fmt_bytes, fmt_s

    return (
        name,
        rules or "(nothing split)",
        fmt_s(cost.time_s),
        fmt_s(cost.comm_s),
        fmt_bytes(cost.peak_memory_bytes),
        "yes" if cost.fits else "no",
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    commands = {
        "serve": cmd_serve,
        "plan": cmd_plan,
        "export": cmd_export,
        "seed": cmd_seed,
        "calibrate": calibrate_cli.cmd_calibrate,
        "scale": scale_cli.cmd_scale,
    }
    try:
        return commands[args.command](args)
    except (ValueError, OSError) as e:  # MtfErrors are ValueErrors; files, network
        print(f"mtf-planner {args.command}: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except MemoryError as e:  # e.g. export --vocab 10**12: numpy says how much
        why = str(e) or "MemoryError"
        print(
            f"mtf-planner {args.command}: error: out of memory: {why}", file=sys.stderr
        )
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
