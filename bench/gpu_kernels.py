"""Do the H100 preset's compute predictions hold on an H100?

The scale plans (``bench/scale.py``) price each op of a stage step by the
``h100-nvlink-ib`` preset's roofline: ``max(flops / 989 TFLOP/s, bytes /
3.35 TB/s)``.  This script checks that against the chip, in three steps:

``export`` (here, :mod:`bench.gpu_export`): plans the reference models that
``bench/scale.py`` puts on H100s, builds each plan's stage graph (one micro-batch, recomputation and
optimizer included) and writes every op of its step, at the per-device slice
shapes and dtypes the layout gives, once per distinct signature, with its
cost-model features and roofline seconds, and each case's ops in step order.

``bench/torch_kernels.py`` (on the GPU machine, PyTorch only) times each
distinct kernel alone and each case's step replayed in order, one unfused
kernel per op as the placement lowering runs them.

``report`` (here): predicted against measured, per case and per op class; a
profile fitted from the measured kernels (``bench/profiles/h100-kernels.json``:
``cost_models.calibration.fit_rates`` on one (features, seconds) row per
distinct kernel, weighted by its share of the steps' time); and the reference
models planned again on that profile.

    .venv/bin/python bench/gpu_kernels.py export             # bench/gpu/kernels.json
    python3 bench/torch_kernels.py bench/gpu/kernels.json bench/gpu/measured-h100-a.json
    .venv/bin/python bench/gpu_kernels.py report bench/gpu/measured-h100-?.json \
        --no-replan                                          # writes the profile
    .venv/bin/python bench/gpu_kernels.py export --hardware \
        bench/profiles/h100-kernels.json -o bench/gpu/kernels-fitted.json
    python3 bench/torch_kernels.py bench/gpu/kernels-fitted.json \
        bench/gpu/measured-fitted-h100-a.json
    .venv/bin/python bench/gpu_kernels.py export --only moe \
        --micro-batches 32,16,8,4 -o bench/gpu/kernels-micro-batches.json
    python3 bench/torch_kernels.py bench/gpu/kernels-micro-batches.json \
        bench/gpu/measured-micro-batches-h100-a.json
    .venv/bin/python bench/gpu_kernels.py report bench/gpu/measured-h100-?.json \
        --held-out bench/gpu/kernels-fitted.json \
        --held-out-measured bench/gpu/measured-fitted-h100-?.json \
        --counts bench/gpu/kernels-micro-batches.json \
        --counts-measured bench/gpu/measured-micro-batches-h100-?.json --write

The plans made on the fitted profile are the held-out check: the fit never
saw their steps.  (The torch_kernels.py runs happen on a GPU machine; their
JSON is committed under bench/gpu/.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import ROOT, replace_section  # noqa: E402
from bench.gpu_export import H100_CASES, export  # noqa: E402

KERNELS_JSON = ROOT / "bench" / "gpu" / "kernels.json"
CHART_SVG = ROOT / "docs" / "img" / "gpu-kernels.svg"
PROFILE_JSON = ROOT / "bench" / "profiles" / "h100-kernels.json"


def measured_seconds(
    runs: Sequence[Mapping[str, Any]],
) -> tuple[list[float | None], dict[str, float]]:
    """Per kernel, the median over ``runs`` of its seconds alone (None: no
    GPU work); per case, the median over runs of each run's median replay."""
    n = len(runs[0]["kernel_seconds"])
    alone: list[float | None] = []
    for i in range(n):
        got = [r["kernel_seconds"][i] for r in runs]
        alone.append(None if got[0] is None else statistics.median(got))
    replay = {
        key: statistics.median(
            statistics.median(r["replays"][key]["seconds"]) for r in runs
        )
        for key in runs[0]["replays"]
        if "seconds" in runs[0]["replays"][key]
    }
    return alone, replay


def fitted_profile(
    spec: Mapping[str, Any], alone: Sequence[float | None], device: str, fit_on: str
) -> dict[str, Any]:
    """The ``h100-nvlink-ib`` preset with per-op-class rates fitted from the
    measured kernels of the cases whose key ends with ``/fit_on``: one row per
    distinct kernel that makes GPU work, weighted by its share of those
    steps' measured time (its count times its seconds), so that the fit
    favours the kernels a step spends its time in.  The same rates serve both
    lowering backends (their kernels are the same ops)."""
    from cost_models.calibration import SWEEP_PRIOR_WEIGHT, fit_rates
    from cost_models.feature_names import FEATURES
    from cost_models.hardware import PRESETS
    from cost_models.op_classes import roofline_rates

    count: dict[int, int] = defaultdict(int)
    mesh = {}
    for c in spec["cases"]:
        if c["key"].endswith("/" + fit_on):
            for i in c["order"]:
                count[i] += 1
                mesh[i] = c
    timed = {i: s for i in sorted(count) if (s := alone[i]) is not None}
    used = list(timed)
    rows = [(spec["kernels"][i]["features"], timed[i]) for i in used]
    weights = [count[i] * timed[i] for i in used]
    preset = PRESETS["h100-nvlink-ib"]
    roof = roofline_rates(preset)
    rates = fit_rates(rows, {f: roof[f] for f in FEATURES}, SWEEP_PRIOR_WEIGHT, weights)
    base = preset.to_dict()
    base["name"] = "h100-kernels"
    base["calibration"] = {
        "backend": "placement",
        "coefficients": {"placement": rates, "spmd": rates},
    }
    base["measured"] = {
        "source": (
            f"bench/gpu_kernels.py: {len(rows)} distinct kernels of the {fit_on} "
            f"stage steps of {', '.join(sorted({c['key'] for c in mesh.values()}))}, "
            f"timed alone with PyTorch on {device}; rows weighted by their share "
            "of those steps' time"
        ),
        "sweep": [
            {
                "kernel": " ".join(
                    x for x in (k["type"], k["fn"] or "", k["class"]) if x
                ),
                "mesh_shape": mesh[i]["stage_mesh"],
                "layout_rules": mesh[i]["layout_rules"],
                "backend": "placement",
                "seconds": timed[i],
                "weight": w,
                "features": k["features"],
            }
            for i, w in zip(used, weights)
            for k in [spec["kernels"][i]]
        ],
    }
    return base


def _priced(
    case: Mapping[str, Any],
    kernels: Sequence[Mapping[str, Any]],
    rates: Mapping[str, float],
) -> tuple[list[int], float, float]:
    """``(order, roofline seconds, seconds on rates)`` of a case's step."""
    from cost_models.calibration import predict_s

    order = case["order"]
    roof = sum(kernels[i]["roofline_s"] for i in order)
    return order, roof, sum(predict_s(kernels[i]["features"], rates) for i in order)


_CHART = """\
<svg xmlns="http://www.w3.org/2000/svg" width="{{ w }}" height="{{ h }}" \
font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{{ left }}" y="16" font-weight="bold">{{ title }}</text>
<rect x="{{ left }}" y="26" width="10" height="10" fill="#999"/>
<text x="{{ left + 15 }}" y="35">roofline (h100-nvlink-ib preset)</text>
<rect x="{{ left + 240 }}" y="26" width="10" height="10" fill="#0072B2"/>
<text x="{{ left + 255 }}" y="35">fitted (h100-kernels profile)</text>
{% for t in ticks %}<line x1="{{ t.x }}" y1="{{ top - 4 }}" x2="{{ t.x }}" \
y2="{{ h - 34 }}" stroke="#ddd"/>
<text x="{{ t.x }}" y="{{ h - 20 }}" text-anchor="middle">{{ t.label }}</text>
{% endfor %}{% for b in bars %}<rect x="{{ left }}" y="{{ b.y }}" width="{{ b.w }}" \
height="9" fill="{{ b.colour }}"/>
{% if b.name %}<text x="{{ left - 6 }}" y="{{ b.y + 14 }}" text-anchor="end">{{ b.name }}\
</text>{% endif %}
{% endfor %}<line x1="{{ one }}" y1="{{ top - 4 }}" x2="{{ one }}" y2="{{ h - 34 }}" \
stroke="#333"/>
<text x="{{ left + (w - left - 20) // 2 }}" y="{{ h - 4 }}" \
text-anchor="middle">priced / measured (the replayed step)</text>
</svg>
"""


def chart(rows: Sequence[tuple[str, float, float]], title: str) -> str:
    """A bar chart (SVG, through an autoescaping template) of ``(case,
    roofline / measured, fitted / measured)`` rows."""
    from jinja2 import Environment

    left, w, top, step = 250, 760, 48, 26
    h = top + step * len(rows) + 44
    top_ratio = 1.25
    scale = (w - left - 20) / top_ratio

    bars = []
    for k, (name, roof, fit) in enumerate(rows):
        y = top + step * k
        bars.append({"y": y, "w": roof * scale, "colour": "#999", "name": name})
        bars.append({"y": y + 10, "w": fit * scale, "colour": "#0072B2", "name": ""})
    ticks = [
        {"x": left + t * scale, "label": f"{t:.2f}"}
        for t in (0.0, 0.25, 0.5, 0.75, 1.0, 1.25)
    ]
    env = Environment(autoescape=True)
    return env.from_string(_CHART).render(
        w=w,
        h=h,
        left=left,
        top=top,
        one=left + scale,
        title=title,
        bars=bars,
        ticks=ticks,
    )


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f}"


def report(
    spec: Mapping[str, Any],
    runs: Sequence[Mapping[str, Any]],
    held_out: tuple[Mapping[str, Any], Sequence[Mapping[str, Any]]] | None = None,
    replan: bool = True,
    counts: tuple[Mapping[str, Any], Sequence[Mapping[str, Any]]] | None = None,
) -> tuple[str, dict[str, Any]]:
    """The markdown section and the profile fitted on ``spec``'s planned
    steps, checked on ``held_out`` (the kernels and runs of plans made on
    that profile, which its fit never saw) and on ``counts`` (one mesh's
    micro-batch counts), if given."""
    from cost_models.profiles import get_hardware

    alone, replay = measured_seconds(runs)
    profile = fitted_profile(spec, alone, runs[0]["device"], "planned")
    hw = get_hardware(profile)
    lines = [
        *_header(runs),
        "",
        *_case_rows(spec, alone, replay, hw.rates or {}),
        "",
        *_class_rows(spec, alone),
        "",
        _rates_line(hw.rates or {}),
    ]
    if held_out is not None:
        lines += ["", *held_out_rows(hw, *held_out)]
    if counts is not None:
        lines += ["", *micro_batch_rows(hw, *counts)]
    lines += [
        "",
        "![Priced / measured per case: the roofline and the fitted profile]"
        "(img/gpu-kernels.svg)",
    ]
    if replan:
        lines += ["", *replanned(hw)]
    return "\n".join(lines), profile


def _header(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    r0 = runs[0]
    return [
        f"Device: {r0['device']} (PyTorch {r0['torch']}, CUDA {r0['cuda']}), "
        f"{len(runs)} runs; its best rates in the same runs: "
        + ", ".join(
            f"{r['chip']['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s (8192^3 bf16 matmul) "
            f"and {r['chip']['copy_bytes_per_s'] / 1e9:.0f} GB/s (copy)"
            for r in runs
        )
        + "; the preset says 989 TFLOP/s and 3,350 GB/s.",
        "",
        "Commands, in order (`G` is `python3 bench/torch_kernels.py`, run "
        "twice on the GPU machine, PyTorch only; the rest run here): "
        "`bench/gpu_kernels.py export`, `G bench/gpu/kernels.json "
        "bench/gpu/measured-h100-a.json` (and `-b`), `bench/gpu_kernels.py "
        "report bench/gpu/measured-h100-?.json --no-replan` (writes the "
        "profile), `bench/gpu_kernels.py export --hardware "
        "bench/profiles/h100-kernels.json -o bench/gpu/kernels-fitted.json`, "
        "`G bench/gpu/kernels-fitted.json bench/gpu/measured-fitted-h100-a.json` "
        "(and `-b`), `bench/gpu_kernels.py export --only moe --micro-batches "
        "32,16,8,4 -o bench/gpu/kernels-micro-batches.json`, `G "
        "bench/gpu/kernels-micro-batches.json "
        "bench/gpu/measured-micro-batches-h100-a.json` (and `-b`), then "
        "`.venv/bin/python bench/gpu_kernels.py report "
        "bench/gpu/measured-h100-?.json --held-out bench/gpu/kernels-fitted.json "
        "--held-out-measured bench/gpu/measured-fitted-h100-?.json --counts "
        "bench/gpu/kernels-micro-batches.json --counts-measured "
        "bench/gpu/measured-micro-batches-h100-?.json --write`.",
    ]


def _case_rows(
    spec: Mapping[str, Any],
    alone: Sequence[float | None],
    replay: Mapping[str, float],
    rates: Mapping[str, float],
) -> list[str]:
    """Each case's step: roofline, fitted and replayed."""
    kernels = spec["kernels"]
    fit_set = {
        i for c in spec["cases"] if c["key"].endswith("/planned") for i in c["order"]
    }
    lines = [
        "One stage step's compute on one device (one micro-batch forward and "
        "backward, recomputation and the Adam update included; no "
        "communication), milliseconds.  *Roofline* is the preset's price "
        "(what `bench/scale.py` plans with); *fitted* is the price on "
        "`bench/profiles/h100-kernels.json`, fitted on the planned steps' "
        "kernels only (each weighted by its share of their time); *replayed* "
        "is the measured step, its kernels run in order, one unfused kernel "
        "per op.",
        "",
        "| case | kernels (distinct) | roofline | fitted | replayed | roofline / replayed | fitted / replayed | the step's kernel time the fit saw |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in spec["cases"]:
        order, roof, fit = _priced(c, kernels, rates)
        meas = replay.get(c["key"])
        seen = sum(alone[i] or 0.0 for i in order if i in fit_set)
        total = sum(alone[i] or 0.0 for i in order)
        shown = "skipped" if meas is None else _ms(meas)
        lines.append(
            f"| {c['key']} | {len(order)} ({len(set(order))}) | {_ms(roof)} | "
            f"{_ms(fit)} | {shown} | "
            + ("" if meas is None else f"{roof / meas:.2f}")
            + " | "
            + ("" if meas is None else f"{fit / meas:.2f}")
            + f" | {seen / total:.0%} |"
        )
    return lines


def _class_rows(spec: Mapping[str, Any], alone: Sequence[float | None]) -> list[str]:
    """Roofline against measured, per op class, over every case."""
    roof_c: dict[str, float] = defaultdict(float)
    meas_c: dict[str, float] = defaultdict(float)
    for c in spec["cases"]:
        for i in c["order"]:
            k = spec["kernels"][i]
            roof_c[k["class"]] += k["roofline_s"]
            meas_c[k["class"]] += alone[i] or 0.0
    lines = [
        "By op class over all cases (kernels timed alone, times their count "
        "in the steps), milliseconds:",
        "",
        "| class | roofline | measured alone | measured / roofline |",
        "|---|---|---|---|",
    ]
    for cls in sorted(roof_c, key=lambda x: -roof_c[x]):
        r, m = roof_c[cls], meas_c[cls]
        lines.append(f"| {cls} | {_ms(r)} | {_ms(m)} | {m / r:.2f} |")
    return lines


def _rates_line(rates: Mapping[str, float]) -> str:
    per_gb = ("matmul", "elementwise", "transcendental", "reduce", "assign")
    return (
        "Fitted rates: "
        f"{1 / rates['matmul_flops'] / 1e12:.0f} TFLOP/s for matmul flops, "
        f"{rates['ops'] * 1e6:.1f} us per op, and per GB "
        + ", ".join(f"{c} {rates[c + '_bytes'] * 1e12:.3f} ms" for c in per_gb)
        + " (the preset's roofline: 0.299 ms per GB)."
    )


def held_out_rows(
    hw: Any, spec: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]
) -> list[str]:
    """Predicted against replayed for steps the fit never saw."""

    _, replay = measured_seconds(runs)
    rates = hw.rates or {}
    kernels = spec["kernels"]
    lines = [
        "Held out: the stage steps of the plans made on the fitted profile "
        "(`export --hardware bench/profiles/h100-kernels.json`), measured "
        f"the same way ({len(runs)} runs), milliseconds:",
        "",
        "| case | kernels (distinct) | roofline | fitted | replayed | roofline / replayed | fitted / replayed |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in spec["cases"]:
        order, roof, fit = _priced(c, kernels, rates)
        meas = replay[c["key"]]
        lines.append(
            f"| {c['key']} | {len(order)} ({len(set(order))}) | {_ms(roof)} | "
            f"{_ms(fit)} | {_ms(meas)} | {roof / meas:.2f} | {fit / meas:.2f} |"
        )
    return lines


def micro_batch_rows(
    hw: Any, spec: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]
) -> list[str]:
    """One mesh's stage step with each micro-batch count: per micro-batch
    and once per step, measured and priced, and the step's compute
    ``(m + p - 1) x per micro-batch + once`` (no communication)."""
    from cost_models.calibration import predict_s

    kernels = spec["kernels"]
    rates = hw.rates or {}
    lines = [
        "Fewer, larger micro-batches on one mesh: each count's stage step "
        "(planned with that count fixed), its per-micro-batch part and its "
        "once-per-step part replayed on their own, and the step's compute "
        "`(m + p - 1) x per micro-batch + once` (no communication), "
        f"milliseconds ({len(runs)} runs):",
        "",
        "| case | plan | per micro-batch: replayed / roofline / fitted | once: replayed / roofline / fitted | step's compute: replayed / roofline / fitted | planned step (preset) |",
        "|---|---|---|---|---|---|",
    ]
    for c in spec["cases"]:
        parts = [r["replays"][c["key"]]["parts"] for r in runs]
        mb = statistics.median(statistics.median(p[0]) for p in parts)
        once = statistics.median(statistics.median(p[1]) for p in parts)
        cut = c["once_at"]
        head, tail = c["order"][:cut], c["order"][cut:]
        roof = [sum(kernels[i]["roofline_s"] for i in x) for x in (head, tail)]
        fit = [
            sum(predict_s(kernels[i]["features"], rates) for i in x)
            for x in (head, tail)
        ]
        slots = c["micro_batches"] + c["stages"] - 1
        lines.append(
            f"| {c['key']} | {c['choice'].split(' (')[0]} | {_ms(mb)} / "
            f"{_ms(roof[0])} / {_ms(fit[0])} | {_ms(once)} / {_ms(roof[1])} / "
            f"{_ms(fit[1])} | {_ms(slots * mb + once)} / "
            f"{_ms(slots * roof[0] + roof[1])} / {_ms(slots * fit[0] + fit[1])} | "
            f"{_ms(c['step_time_s'])} |"
        )
    return lines


def ratio_rows(
    hw: Any, spec: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]
) -> list[tuple[str, float, float]]:
    """``(case, roofline / replayed, on hw / replayed)`` of each replayed case."""
    _, replay = measured_seconds(runs)
    out = []
    for c in spec["cases"]:
        meas = replay.get(c["key"])
        if meas is not None:
            _, roof, fit = _priced(c, spec["kernels"], hw.rates or {})
            out.append((c["key"], roof / meas, fit / meas))
    return out


def replanned(hw: Any) -> list[str]:
    """The H100 cases planned on the preset and on ``hw``, each plan priced
    on both."""
    from bench.scale import CASES
    from layout_planner.choices import plan_transformer, price_layout

    lines = [
        "The H100 reference models planned on the preset and on the fitted "
        "profile (`bench/scale.py`'s models and search), each plan priced on "
        "both (whole pipelined step with communication, seconds; MFU on "
        "989 TFLOP/s):",
        "",
        "| model | planned on | plan | step on preset | step on fitted | MFU on fitted |",
        "|---|---|---|---|---|---|",
    ]
    for case in CASES:
        if case.key not in H100_CASES:
            continue
        print(f"{case.key}: planning on the preset and on {hw.name} ...", flush=True)
        for name, prof in (("preset", case.hardware), ("fitted", hw)):
            plan = plan_transformer(case.config, case.devices, prof)
            other = price_layout(
                case.config,
                plan.choice,
                plan.layout_rules,
                hw if name == "preset" else case.hardware,
            )
            on_preset, on_fitted = (plan, other) if name == "preset" else (other, plan)
            c = plan.choice
            lines.append(
                f"| {case.title} | {name} | pp {c.stages} x dp {c.data} x tp "
                f"{c.tensor}, m {c.micro_batches}, recompute "
                f"{c.recompute_attention}/{c.recompute_ffn} | "
                f"{on_preset.step_time_s:.2f} | {on_fitted.step_time_s:.2f} | "
                f"{on_fitted.mfu:.1%} |"
            )
    return lines


def _load(
    ap: argparse.ArgumentParser, kernels: Path, measured: Sequence[Path]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    spec = json.loads(kernels.read_text())
    if not measured:
        ap.error(f"no measurements given for {kernels}")
    runs = [json.loads(p.read_text()) for p in measured]
    for p, r in zip(measured, runs):
        if len(r["kernel_seconds"]) != len(spec["kernels"]):
            ap.error(
                f"{p} has {len(r['kernel_seconds'])} kernels; {kernels} has "
                f"{len(spec['kernels'])}: measure the kernels file it was "
                "exported as"
            )
    return spec, runs


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export", help="plan the H100 cases and write their kernels")
    ex.add_argument("-o", "--out", type=Path, default=KERNELS_JSON)
    ex.add_argument("--only", default=",".join(H100_CASES))
    ex.add_argument(
        "--hardware",
        help="plan on this profile (a preset name or .json) instead of the "
        "cases' preset, and export only those plans",
    )
    ex.add_argument(
        "--micro-batches",
        default="",
        help="comma-separated counts: export the plans with each, on the "
        "planned mesh, instead",
    )
    rp = sub.add_parser("report", help="compare measured kernels with the model")
    rp.add_argument("measured", nargs="+", type=Path)
    rp.add_argument("--kernels", type=Path, default=KERNELS_JSON)
    rp.add_argument(
        "--held-out", type=Path, help="kernels of plans made on the profile"
    )
    rp.add_argument("--held-out-measured", nargs="+", type=Path, default=[])
    rp.add_argument(
        "--counts", type=Path, help="kernels of one mesh's micro-batch counts"
    )
    rp.add_argument("--counts-measured", nargs="+", type=Path, default=[])
    rp.add_argument("--profile", type=Path, default=PROFILE_JSON)
    rp.add_argument("--no-replan", action="store_true")
    rp.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    if args.cmd == "report":
        spec, runs = _load(ap, args.kernels, args.measured)
        held = None
        if args.held_out is not None:
            held = _load(ap, args.held_out, args.held_out_measured)
        counts = None
        if args.counts is not None:
            counts = _load(ap, args.counts, args.counts_measured)
        body, profile = report(spec, runs, held, not args.no_replan, counts)
        print(body)
        args.profile.write_text(json.dumps(profile, indent=1) + "\n")
        print(f"wrote {args.profile}")
        if args.write:
            from cost_models.profiles import get_hardware

            hw = get_hardware(profile)
            rows = ratio_rows(hw, spec, runs)
            if held is not None:
                rows += ratio_rows(hw, *held)
            CHART_SVG.write_text(
                chart(rows, f"One stage step's compute on {runs[0]['device']}")
            )
            replace_section(
                "gpu-kernels",
                body,
                title="GPU kernels: the H100 preset against an H100",
            )
            print(f"wrote {CHART_SVG} and docs/benchmarks.md")
        return 0
    if args.cmd == "export":
        keys = [k for k in args.only.split(",") if k]
        bad = sorted(set(keys) - set(H100_CASES))
        if bad:
            ap.error(f"--only {bad}: expected among {list(H100_CASES)}")
        counts = [int(m) for m in args.micro_batches.split(",") if m]
        if any(m < 1 for m in counts):
            ap.error(f"--micro-batches {counts}: expected positive counts")
        export(keys, args.out, args.hardware, counts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
