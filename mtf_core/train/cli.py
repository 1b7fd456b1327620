"""``mtf-train``: train a Transformer LM on Python's own sources, or sample.

    mtf-train --layout 2d --devices 8 --steps 300 --checkpoint_dir runs/lm
    mtf-train --layout "batch:x;d_ff:y" --mesh "x:2;y:4" --resume --checkpoint_dir runs/lm
    mtf-train --layout auto --mesh "x:2;y:4" --steps 50
    mtf-train sample --checkpoint_dir runs/lm --prompt "def " --temperature 0.8

(also ``python -m mtf_core.train``).  A run writes checkpoints of full
variable values; ``--resume`` continues from the newest one under any mesh
and layout.  ``--tensorboard DIR`` writes loss and tokens/s scalars.

Exits 0 on success, 2 on a bad option or a file it cannot read or write
(one line on stderr naming it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

from mtf_core.errors import ConfigError, MtfError
from mtf_core.models.transformer import TransformerConfig
from mtf_core.presets import LayoutChoice, preset_names, resolve_layout
from mtf_core.shapes import convert_to_shape
from mtf_core.train.checkpoint import Checkpoint, latest_checkpoint, load_checkpoint
from mtf_core.train.data import (
    CharVocab,
    TextDataset,
    python_source_text,
    tokens_per_second,
    unigram_entropy,
)

_MODEL_FLAGS = (
    "num_layers",
    "d_model",
    "heads",
    "d_kv",
    "d_ff",
    "length",
    "batch",
    "activation_dtype",
    "master_dtype",
    "shardable_weights",
    "shardable_slots",
)


def _train_parser(p: argparse.ArgumentParser) -> None:
    m = p.add_argument_group("model")
    m.add_argument("--num_layers", "--layers", type=int, default=2)
    m.add_argument("--d_model", type=int, default=64)
    m.add_argument("--heads", type=int, default=8)
    m.add_argument("--d_kv", type=int, default=8)
    m.add_argument("--d_ff", type=int, default=256)
    m.add_argument("--length", type=int, default=64)
    m.add_argument("--batch", type=int, default=16)
    m.add_argument(
        "--vocab",
        type=int,
        default=96,
        help="vocabulary size: pad, unknown and the most frequent characters",
    )
    m.add_argument("--dropout", type=float, default=0.0)
    m.add_argument(
        "--activation_dtype",
        default="float32",
        help="dtype of activations, their gradients and collectives (bfloat16: "
        "mixed precision)",
    )
    m.add_argument(
        "--master_dtype",
        default="float32",
        help="dtype of the stored weights and optimizer slots",
    )
    m.add_argument(
        "--shardable_weights",
        action="store_true",
        help="store weights under d_model_stored_<class> names, which a layout "
        "may put on the data axis (ZeRO/FSDP)",
    )
    m.add_argument(
        "--shardable_slots",
        action="store_true",
        help="update weights under d_model_slots_<class> names, which a layout "
        "may put on the data axis (optimizer slots only sharded: ZeRO-1)",
    )
    m.add_argument("--config", help="JSON file with TransformerConfig fields")
    lay = p.add_argument_group("layout")
    lay.add_argument(
        "--layout",
        default="data-parallel",
        help=f"a preset ({', '.join(preset_names())}), rules such as "
        "'batch:x;d_ff:y', or 'auto' (the layout planner)",
    )
    lay.add_argument("--mesh", help="mesh shape, e.g. 'x:2;y:4' (default: preset's)")
    lay.add_argument("--devices", type=int, help="logical CPU devices (default: mesh)")
    t = p.add_argument_group("training")
    t.add_argument("--steps", type=int, default=200)
    t.add_argument("--optimizer", default="adam")
    t.add_argument("--learning_rate", "--lr", type=float, default=3e-3)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--corpus_bytes", type=int, default=2_000_000)
    t.add_argument("--checkpoint_dir")
    t.add_argument("--save_every", type=int, default=100)
    t.add_argument("--resume", action="store_true", help="continue from the latest")
    t.add_argument("--tensorboard", help="directory for TensorBoard scalars")
    t.add_argument("--eval_every", type=int, default=0)
    t.add_argument(
        "--no_eval", action="store_true", help="skip the held-out loss at the end"
    )
    t.add_argument("--no_progress", action="store_true", help="no progress bar")
    r = p.add_argument_group("reporting the measured step to a planner service")
    r.add_argument("--report", metavar="URL", help="planner service to report to")
    r.add_argument("--plan_id", help="the stored plan this run's layout came from")
    r.add_argument("--token", help="API token for --report (or $MTF_PLANNER_TOKEN)")
    r.add_argument(
        "--profile_ops",
        action="store_true",
        help="profile the last two steps with TensorFlow's profiler: seconds per "
        "op class, printed in the summary and sent with --report",
    )


def _sample_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint_dir", "--checkpoint", required=True)
    p.add_argument("--prompt", default="def ")
    p.add_argument("--max_new_tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layout", default="", help="rules or preset (default: none)")
    p.add_argument("--mesh", default="all:1")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mtf-train", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    sub = p.add_subparsers(dest="command")
    _train_parser(sub.add_parser("train", help="train (the default command)"))
    _sample_parser(sub.add_parser("sample", help="generate text from a checkpoint"))
    return p


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("train", "sample", "-h", "--help"):
        argv = ["train", *argv]
    return build_parser().parse_args(argv)


# --------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------


def _config_file(path: str) -> dict[str, Any]:
    """The ``--config`` file's TransformerConfig fields."""
    try:
        with open(path, "rb") as f:
            fields = json.loads(f.read())
    except OSError as e:
        raise ConfigError(f"--config {path!r}: {e.strerror or e}") from None
    except ValueError as e:  # not JSON, or not UTF-8
        raise ConfigError(f"--config {path!r} is not valid JSON: {e}") from None
    if not isinstance(fields, dict):
        raise ConfigError(
            f"--config {path!r} holds a JSON {type(fields).__name__}; expected an "
            'object of TransformerConfig fields, e.g. {"d_model": 128}'
        )
    return fields


def _check_options(args: argparse.Namespace) -> None:
    """The numbers and paths of the options, checked before any slow work, so
    that a typo fails at once (not after the corpus, or the whole run)."""

    def at_least(option: str, low: int) -> None:
        value = getattr(args, option)
        if value is not None and value < low:
            raise ConfigError(f"--{option} is {value}; expected an integer >= {low}")

    if args.command == "sample":
        at_least("max_new_tokens", 0)
        if not math.isfinite(args.temperature) or args.temperature < 0:
            raise ConfigError(
                f"--temperature is {args.temperature}; expected a number >= 0 "
                "(0: greedy)"
            )
        return
    for option, low in (
        ("steps", 1),
        ("devices", 1),
        ("save_every", 1),
        ("eval_every", 0),
        ("corpus_bytes", 1),
    ):
        at_least(option, low)
    from mtf_core.optimize import make_optimizer

    make_optimizer(args.optimizer, args.learning_rate)
    if not args.resume:  # a resumed run takes its model from the checkpoint
        model_config(args, args.vocab)  # the corpus's vocabulary may be smaller
    for option in ("checkpoint_dir", "tensorboard"):
        path = getattr(args, option)
        if path:
            try:
                os.makedirs(path, exist_ok=True)
            except OSError as e:
                raise ConfigError(
                    f"--{option} {path!r}: cannot make the directory "
                    f"({e.strerror or e})"
                ) from None
            if not os.access(path, os.W_OK):
                raise ConfigError(f"--{option} {path!r} is not writable")


def model_config(args: argparse.Namespace, vocab_size: int) -> TransformerConfig:
    fields: dict[str, Any] = {f: getattr(args, f) for f in _MODEL_FLAGS}
    if args.config:
        # Read once, by the first call (the options' check): the run builds
        # the model it checked, even if the file changes meanwhile.
        if getattr(args, "config_fields", None) is None:
            args.config_fields = _config_file(args.config)
        fields.update(args.config_fields)
    fields["vocab"] = vocab_size
    fields["dropout_rate"] = args.dropout
    return TransformerConfig.from_dict(fields)


def device_count(args: argparse.Namespace) -> int:
    if args.mesh:
        n = convert_to_shape(args.mesh).size
        if args.devices and args.devices != n:
            raise ConfigError(
                f"--mesh {args.mesh!r} has {n} processors but --devices is "
                f"{args.devices}"
            )
        return n
    return args.devices or 8


def _warn_of_rules_for_no_dim(layout: LayoutChoice, model: Any) -> None:
    """A rule naming no dim of the model splits nothing (as in Mesh TF, a
    layout may name dims a model lacks): likely a misspelling, so say so."""
    dims = {n for op in model.graph.operations for n in op.all_dim_names}
    for name, axis in layout.rules:
        if name not in dims:
            print(
                f"mtf-train: warning: layout rule '{name}:{axis}' names no dim of "
                f"this model, so it splits nothing (its dims: {', '.join(sorted(dims))})",
                file=sys.stderr,
                flush=True,
            )


def choose_layout(args: argparse.Namespace, model: Any, n: int) -> LayoutChoice:
    """Resolves ``--layout``; ``auto`` asks the layout planner."""
    if args.layout.strip().lower() != "auto":
        return resolve_layout(args.layout, n, args.mesh)
    import mtf_core

    try:
        auto_layout = mtf_core.auto_layout
    except (AttributeError, ImportError) as e:
        raise ConfigError(
            f"--layout auto needs the layout planner (mtf.auto_layout): {e}"
        ) from None
    mesh = (
        convert_to_shape(args.mesh) if args.mesh else resolve_layout("dp", n).mesh_shape
    )
    plan = auto_layout(model.graph, mesh, outputs=[model.loss])
    return LayoutChoice(mesh, plan.layout_rules, "auto")


# --------------------------------------------------------------------------
# commands
# --------------------------------------------------------------------------


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Runs training; returns a summary (final loss, entropy, checkpoint, the
    fastest step); with ``--report``, sends that step to the planner service
    as a measurement of plan ``--plan_id``."""
    if args.report and not args.plan_id:
        raise ConfigError("--report needs --plan_id (the plan this layout came from)")
    _check_options(args)
    _profiled_steps(args)  # checked before any slow work
    n = device_count(args)
    auto = args.layout.strip().lower() == "auto"
    # Checked before any slow work, so a typo fails at once.
    layout = None if auto else resolve_layout(args.layout, n, args.mesh)
    from mtf_core.lowering.devices import logical_cpu_devices

    devices = logical_cpu_devices(n)  # before any other TensorFlow work
    from mtf_core.lowering import training
    from mtf_core.models.transformer import build_lm
    from mtf_core.optimize import make_optimizer

    resume: Checkpoint | None = None
    if args.resume:
        if not args.checkpoint_dir:
            raise ConfigError("--resume needs --checkpoint_dir")
        if latest_checkpoint(args.checkpoint_dir) is not None:
            resume = load_checkpoint(args.checkpoint_dir)
    text = python_source_text(args.corpus_bytes)
    if resume is not None:
        vocab = CharVocab.from_json(resume.metadata["vocab"])
        cfg = TransformerConfig.from_dict(resume.metadata["model"])
    else:
        vocab = CharVocab.build(text, args.vocab)
        cfg = model_config(args, vocab.size)
    ids = vocab.encode_array(text)
    data = TextDataset(ids, cfg.batch, cfg.length, seed=args.seed)
    entropy = unigram_entropy(data.train_ids)
    model = build_lm(cfg, make_optimizer(args.optimizer, args.learning_rate))
    if layout is None:
        layout = choose_layout(args, model, n)
    _warn_of_rules_for_no_dim(layout, model)
    print(
        f"model: {cfg.num_layers} layers, d_model {cfg.d_model}, vocab {cfg.vocab}, "
        f"{model.num_parameters:,} parameters; {layout}; corpus {len(ids):,} "
        f"tokens, unigram entropy {entropy:.3f} nats",
        flush=True,
    )
    trainer = training.Trainer(model, layout, devices)
    if resume is not None:
        trainer.restore(resume)
        print(f"resumed from {resume.path} at step {trainer.global_step}", flush=True)
    meta = {
        "model": cfg.to_dict(),
        "vocab": vocab.to_json(),
        "optimizer": args.optimizer,
        "learning_rate": args.learning_rate,
        "seed": args.seed,
    }
    writer = training.summary_writer(args.tensorboard)
    first = trainer.global_step
    bar = _progress(args.steps, first, disabled=args.no_progress)
    loss = float("nan")
    saved = None
    t_start = time.perf_counter()
    step_times: list[float] = []
    profiled = _profiled_steps(args)
    spans = ExitStack()
    prof = None
    for i in range(args.steps):
        if i == args.steps - profiled:
            from mtf_core.lowering.op_profile import profiling

            prof = spans.enter_context(profiling())
        t0 = time.perf_counter()
        loss = trainer.step(data.batch(trainer.global_step))
        dt = time.perf_counter() - t0
        step_times.append(dt)
        tps = tokens_per_second(cfg.batch, cfg.length, dt)
        step = trainer.global_step
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tps:,.0f}")
        scalars = {"loss": loss, "tokens_per_second": tps}
        if args.eval_every and step % args.eval_every == 0:
            scalars["eval_loss"] = trainer.evaluate(data.eval_batch())
        training.write_scalars(writer, step, scalars)
        last = i == args.steps - 1
        if args.checkpoint_dir and (last or step % args.save_every == 0):
            saved = trainer.save(args.checkpoint_dir, {**meta, "loss": loss})
    bar.close()
    spans.close()  # ends the profile: its steps' times are in step_times too
    eval_loss = None if args.no_eval else trainer.evaluate(data.eval_batch())
    summary: dict[str, Any] = {
        "steps": trainer.global_step - first,
        "global_step": trainer.global_step,
        "loss": loss,
        "eval_loss": eval_loss,
        "unigram_entropy": entropy,
        "seconds": time.perf_counter() - t_start,
        "layout": str(layout.rules),
        "mesh_shape": str(layout.mesh_shape),
        "checkpoint": saved,
        # The first step traces and optimizes the function: not a step time.
        "step_s": min(step_times[1 : -profiled or None] or step_times or [math.nan]),
    }
    if prof is not None:
        summary["op_profile"] = prof.per_step(profiled)
    if args.report:
        summary["report"] = _report(args, summary, layout)
    print(json.dumps(summary), flush=True)
    return summary


def _report(args: argparse.Namespace, summary: dict[str, Any], layout: Any) -> Any:
    """Sends the fastest step to the planner service for ``--plan_id``."""
    import mtf_core
    from mtf_core.train.measurement import StepMeasurement

    m = StepMeasurement(
        wall_s=summary["step_s"],
        cpu_s=summary["step_s"],
        steps=max(1, summary["steps"] - 1 - _profiled_steps(args)),
        mesh_shape=str(layout.mesh_shape),
        layout_rules=str(layout.rules),
        op_profile=summary.get("op_profile"),
    )
    try:
        report = mtf_core.report_measurement
    except (AttributeError, ImportError) as e:
        raise ConfigError(f"--report needs the planner client: {e}") from None
    return report(args.report, args.plan_id, m, token=args.token, source="mtf-train")


def _profiled_steps(args: argparse.Namespace) -> int:
    """How many of the last steps ``--profile_ops`` profiles (none without it;
    the first step, which traces, never): they are left out of ``step_s``,
    since the profiler slows them."""
    if not args.profile_ops:
        return 0
    steps: int = args.steps
    if steps < 3:
        raise ConfigError(
            f"--profile_ops needs at least 3 steps (one to trace, one to time, "
            f"one to profile), got --steps {steps}"
        )
    return min(2, steps - 2)


def _progress(total: int, initial: int, disabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=f"train from step {initial}", disable=disabled)


def sample(args: argparse.Namespace) -> str:
    """Generates text from a checkpoint; returns (and prints) it."""
    _check_options(args)
    ckpt = load_checkpoint(args.checkpoint_dir)
    choice = resolve_layout(
        args.layout or None, convert_to_shape(args.mesh).size, args.mesh
    )
    from mtf_core.lowering.devices import logical_cpu_devices

    devices = logical_cpu_devices(choice.mesh_shape.size)
    from mtf_core.lowering.training import LMSampler
    from mtf_core.models.transformer import build_lm

    vocab = CharVocab.from_json(ckpt.metadata["vocab"])
    cfg = TransformerConfig.from_dict(ckpt.metadata["model"]).replace(
        batch=choice.mesh_shape.size if "batch" in choice.rules.as_dict() else 1
    )
    sampler = LMSampler(build_lm(cfg), ckpt.values, choice, devices)
    prompt = vocab.encode(args.prompt)
    if not prompt:
        raise ConfigError("--prompt must not be empty")
    out = sampler.generate(
        [prompt] * sampler.batch, args.max_new_tokens, args.temperature, args.seed
    )
    text = vocab.decode(out[0])
    print(text, flush=True)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    args = parse_args(argv)
    try:
        if args.command == "sample":
            sample(args)
        else:
            train(args)
    except (MtfError, OSError) as e:  # options; files it cannot read or write
        print(f"mtf-train: error: {e}", file=sys.stderr)
        return 2
    return 0
