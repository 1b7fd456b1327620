"""``mtf-planner scale``: plan a Transformer at scale, here or on a service.

    mtf-planner scale --layers 4 --d-model 1024 --heads 16 --d-kv 64 \\
        --d-ff 4096 --vocab 32000 --length 1024 --batch 64 --devices 8 \\
        [--hardware h100-nvlink-ib] [--activation-dtype bfloat16] \\
        [--stages 1,2] [--micro-batches 8] [--server URL] [--json]

Prints ``ScalePlan.explain()`` (``--json``: the ``/v1/scale-plans`` answer's
``plan``); it reports progress on stderr (planning here: each mesh it
tries; with ``--server``: the job's phase while it waits; ``--quiet``:
none).  Exits 0 when a plan fits, 3 when none does, 1 on bad input or an
unreachable server.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

#: Model options (``--d-model``) -> the request's ``model`` fields.
_SIZES = (
    ("layers", "num_layers", True),
    ("d_model", "d_model", True),
    ("heads", "heads", True),
    ("d_kv", "d_kv", True),
    ("d_ff", "d_ff", True),
    ("vocab", "vocab", True),
    ("length", "length", True),
    ("batch", "batch", True),
    ("experts", "experts", False),
)

EXIT_OK, EXIT_ERROR, EXIT_NOTHING_FITS = 0, 1, 3


def add_parser(sub: Any) -> None:
    s = sub.add_parser(
        "scale",
        help="plan a Transformer's mesh, pipeline, dtypes, ZeRO and recomputation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for option, _, required in _SIZES:
        s.add_argument(
            f"--{option.replace('_', '-')}",
            type=int,
            required=required,
            default=None if required else 0,
        )
    s.add_argument("--encoder-decoder", action="store_true")
    s.add_argument("--devices", type=int, required=True)
    s.add_argument("--hardware", default="h100-nvlink-ib", help="a preset name")
    s.add_argument("--activation-dtype", default="bfloat16")
    s.add_argument("--master-dtype", default="float32")
    s.add_argument("--optimizer", default="adam")
    s.add_argument("--stages", help="pipeline stage counts to try, e.g. 1,2,4")
    s.add_argument("--tensor", help="tensor-axis sizes to try, e.g. 4,8")
    s.add_argument(
        "--sequence", help="sequence-axis sizes to try, e.g. 1,2 (default: none)"
    )
    s.add_argument("--micro-batches", type=int)
    s.add_argument("--schedule", default="1f1b", help="1f1b or gpipe")
    s.add_argument(
        "--recompute",
        help="options to try, e.g. 'none/none,block/block' (attention/ffn)",
    )
    s.add_argument("--memory-limit-bytes", type=int)
    s.add_argument("--time-limit", type=float, default=5.0, help="CP-SAT s per trial")
    s.add_argument("--server", help="plan on this planner service (http://host:port)")
    s.add_argument("--token", help="API token for the server (or $MTF_PLANNER_TOKEN)")
    s.add_argument(
        "--no-measurements",
        action="store_true",
        help="with --server: plan with the preset as shipped, not refitted from "
        "the steps the service measured",
    )
    s.add_argument("--json", action="store_true", help="print the plan as JSON")
    s.add_argument("--quiet", action="store_true", help="no progress on stderr")


#: Request fields whose option is not spelled like them.
_OPTION_OF = {"time_limit_s": "time_limit"} | {
    field: option for option, field, _ in _SIZES
}


def _option(loc: Sequence[Any]) -> str:
    """The option a validation error's location names: ``('model',
    'num_layers')`` -> ``--layers``, ``('stages', 0)`` -> ``--stages``."""
    parts = [str(x) for x in loc if not isinstance(x, int)]
    name = parts[-1] if parts[:1] == ["model"] else parts[0] if parts else "?"
    return "--" + _OPTION_OF.get(name, name).replace("_", "-")


def _progress(quiet: bool) -> Callable[[str, float], None] | None:
    """Reports ``(phase, fraction)`` on stderr: one line rewritten in place on
    a terminal, a line per phase otherwise."""
    if quiet:
        return None
    tty = sys.stderr.isatty()

    def report(phase: str, fraction: float) -> None:
        line = f"mtf-planner scale: [{fraction:4.0%}] {phase}"
        if tty:
            sys.stderr.write(f"\r\033[K{line[:200]}")
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    return report


def _end_progress(report: Callable[[str, float], None] | None) -> None:
    """Ends the progress line on a terminal (rewritten in place until now)."""
    if report is not None and sys.stderr.isatty():
        sys.stderr.write("\n")


def _ints(option: str, text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(
            f"--{option} {text!r} is not a comma-separated list of integers"
        ) from None


def scale_request(args: argparse.Namespace) -> dict[str, Any]:
    """The ``POST /v1/scale-plans`` body for these options."""
    body: dict[str, Any] = {
        "model": {field: getattr(args, option) for option, field, _ in _SIZES}
        | {"encoder_decoder": args.encoder_decoder},
        "devices": args.devices,
        "hardware": args.hardware,
        "activation_dtype": args.activation_dtype,
        "master_dtype": args.master_dtype,
        "optimizer": args.optimizer,
        "stages": _ints("stages", args.stages),
        "tensor": _ints("tensor", args.tensor),
        "sequence": _ints("sequence", args.sequence),
        "micro_batches": args.micro_batches,
        "schedule": args.schedule,
        "memory_limit_bytes": args.memory_limit_bytes,
        "time_limit_s": args.time_limit,
    }
    if args.recompute:
        options = []
        for part in args.recompute.split(","):
            attention, _, ffn = part.partition("/")
            if not ffn:
                raise ValueError(
                    f"--recompute option {part!r}; expected ATTENTION/FFN, "
                    "e.g. none/none or block/block"
                )
            options.append({"attention": attention, "ffn": ffn})
        body["recompute"] = options
    return body


def _nothing_fits(message: str) -> bool:
    """Whether a ``ScaleError``'s message says the search found no plan (none
    fits, or none could be laid out), rather than that the request leaves no
    mesh to search ("no mesh of 7 devices to try: ..."), an input error."""
    return message.startswith("no plan for ")


def cmd_scale(args: argparse.Namespace) -> int:
    from api.planning import RequestError
    from api.scale_schemas import ScalePlanRequest
    from layout_planner.choices import ScaleError

    body = scale_request(args)
    if args.server:
        from api.client import PlannerClient
        from layout_planner.errors import PlannerError

        if args.no_measurements:
            body["use_measurements"] = False
        report = _progress(args.quiet)
        try:
            with PlannerClient(args.server, token=args.token, timeout_s=300) as c:
                out = c.scale_plan(body, progress=report)
                server = c.shown_url  # no password
        except PlannerError as e:  # the answer, or the job it waited for
            if _nothing_fits(str(e).partition("ScaleError: ")[2]):
                print(f"mtf-planner scale: nothing fits: {e}")
                return EXIT_NOTHING_FITS
            raise
        finally:
            _end_progress(report)
        plan = out["plan"]
        where = (
            f"{server} (scale plan {out.get('id')}"
            f"{', cached' if out.get('cached') else ''})"
        )
        if out.get("profile"):
            where += f"; profile: {out['profile']['text']}"
    else:
        from pydantic import ValidationError

        from api.scale_planning import (
            plan_spec_locally,
            recompute_costs,
            scale_plan_dict,
            scale_spec,
            weight_classes,
        )
        from api.settings import Settings

        try:
            spec = scale_spec(ScalePlanRequest.model_validate(body), Settings())
        except ValidationError as e:
            err = e.errors()[0]
            raise RequestError(
                f"{_option(err['loc'])} is {err.get('input')!r}: {err['msg']}"
            ) from None
        report = _progress(args.quiet)
        try:
            scale = plan_spec_locally(spec, progress=report, workers=None)
        except ScaleError as e:
            if not _nothing_fits(str(e)):
                raise  # a request no mesh can serve: the CLI's input error
            print(f"mtf-planner scale: nothing fits: {e}")
            return EXIT_NOTHING_FITS
        finally:
            _end_progress(report)
        plan = scale_plan_dict(
            scale, recompute_costs(scale, spec), weight_classes(scale, spec)
        )
        where = "this machine"
    if args.json:
        from mtf_core.serialization.schema import json_safe

        print(json.dumps(json_safe(plan, "plan"), indent=2))
    else:
        print(f"planned on {where}")
        print(format_scale_plan(plan))
    return EXIT_OK if plan["fits"] else EXIT_NOTHING_FITS


def format_scale_plan(plan: dict[str, Any]) -> str:
    """``explain()``, then what each weight class's sharding saves and what
    each recomputation option costs on the chosen mesh."""
    from layout_planner.plan import fmt_bytes, fmt_s

    def signed_s(v: float) -> str:
        return ("+" if v >= 0 else "-") + fmt_s(abs(v))

    def signed_b(v: int) -> str:
        return ("+" if v >= 0 else "-") + fmt_bytes(abs(v))

    lines = [plan["explain"], "weight classes (stage step, one micro-batch):"]
    for w in plan["weight_classes"]:
        where = f"split over {w['mesh_axis']}" if w["sharded"] else "whole"
        saves = ""
        if w["saves_step_time_s"] is not None:
            saves = (
                f"; keeping it whole: {signed_s(w['saves_step_time_s'])}, "
                f"{signed_b(w['saves_peak_memory_bytes'])}"
            )
        lines.append(f"  {w['storage_dim']}: {where}{saves}")
    lines.append("recomputation on this mesh:")
    for o in plan["recompute"]["options"]:
        name = f"attention={o['attention']} ffn={o['ffn']}"
        if o["step_time_s"] is None:
            lines.append(f"  {name}: not priced ({o['source']})")
            continue
        mark = " (chosen)" if o["chosen"] else ""
        lines.append(
            f"  {name}{mark}: {fmt_s(o['step_time_s'])} "
            f"({signed_s(o['step_time_delta_s'])}), "
            f"{fmt_bytes(o['peak_memory_bytes'])} "
            f"({signed_b(o['peak_memory_delta_bytes'])}), "
            f"{'fits' if o['fits'] else 'does not fit'}"
        )
    return "\n".join(lines)
