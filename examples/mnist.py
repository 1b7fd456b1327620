"""Mesh TensorFlow's README network, trained on real handwritten digits.

One hidden layer of 1024 units over named dims ``batch``, ``rows``, ``cols``,
``hidden`` and ``classes``.  The images are scikit-learn's bundled digits
(1,797 scans of handwritten digits, 8x8 pixels, so ``rows:8`` and ``cols:8``):
real data that ships with an installed package, so the example needs no
download.

The layout is a command-line flag; it changes where the work runs, never the
numbers::

    python examples/mnist.py                                   # one device
    python examples/mnist.py --mesh_shape "all:4" --layout "batch:all"     # data
    python examples/mnist.py --mesh_shape "all:4" --layout "hidden:all"    # model
    python examples/mnist.py --mesh_shape "rows:2;cols:2" \\
        --layout "batch:rows;hidden:cols"                      # both (2-D)

Tests import :func:`train` and :func:`build_model` rather than running a
subprocess.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import mtf_core as mtf  # noqa: E402

# The network itself lives in the library (the planner service plans it too);
# this file is the data and the training loop.
from mtf_core.models.mnist import build_mnist as build_model  # noqa: E402


@dataclass(frozen=True)
class Digits:
    """Train and test splits: images in [0, 1] of shape [n, 8, 8], int32 labels."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray


def load_digits(test_fraction: float = 0.2, seed: int = 0) -> Digits:
    """scikit-learn's digits, scaled to [0, 1] and split by a seeded shuffle."""
    from sklearn.datasets import load_digits as sk_load_digits

    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    data = sk_load_digits()
    # Pixel values are counts 0..16 of the original 4x4 blocks.
    images = (data.images / 16.0).astype(np.float32)
    labels = data.target.astype(np.int32)
    order = np.random.RandomState(seed).permutation(len(labels))
    n_test = int(round(len(labels) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return Digits(images[train], labels[train], images[test], labels[test])


@dataclass
class TrainResult:
    """What a training run measured."""

    losses: list[float]  # the training loss of every step, before its update
    test_accuracy: float
    counters: Any  # collectives and flops of one training step (mtf Counters)
    trace_seconds: float  # lowering the training step into a tf.function
    train_seconds: float


def train(
    mesh_shape: str = "all:1",
    layout: str = "",
    steps: int = 300,
    batch_size: int = 100,
    lr: float = 0.1,
    momentum: float = 0.9,
    seed: int = 0,
    hidden_size: int = 1024,
    devices: Sequence[str] | None = None,
    log_every: int = 0,
    log: Callable[[str], None] = print,
) -> TrainResult:
    """Trains for ``steps`` steps under ``layout`` and measures test accuracy.

    Batches are drawn from a shuffle seeded by ``seed`` and variables start from
    name-seeded initial values, so two runs that differ only in mesh and layout
    see the same numbers.  ``devices`` defaults to ``mtf.logical_devices(n)``
    for the mesh's ``n`` processors.

    >>> # result = train("rows:2;cols:2", "batch:rows;hidden:cols", steps=100)
    >>> # result.test_accuracy  -> about 0.97
    """
    if steps <= 0:
        raise ValueError(f"steps must be positive, got {steps}")
    shape = mtf.convert_to_shape(mesh_shape)
    if devices is None:
        devices = mtf.logical_devices(shape.size)
    devices = list(devices)[: shape.size]
    data = load_digits(seed=seed)
    if batch_size > len(data.train_labels):
        raise ValueError(
            f"batch_size {batch_size} is larger than the training set "
            f"({len(data.train_labels)} examples)"
        )
    model = build_model(batch_size, hidden_size, lr, momentum)
    impl = mtf.PlacementMeshImpl(shape, layout, devices)
    step_fn = mtf.compile_function(
        model.graph,
        {model.mesh: impl},
        inputs=[model.images, model.labels],
        outputs=[model.loss],
        updates=model.updates,
    )
    trace_s = step_fn.trace()
    predict_fn = mtf.compile_function(
        model.graph,
        {model.mesh: impl},
        inputs=[model.images],
        outputs=[model.logits],
        variables=step_fn.variables,
    )

    batches = _batches(len(data.train_labels), batch_size, seed)
    losses: list[float] = []
    t0 = time.perf_counter()
    for step in range(steps):
        idx = next(batches)
        (loss,) = step_fn(data.train_images[idx], data.train_labels[idx])
        losses.append(float(loss))
        if log_every and (step + 1) % log_every == 0:
            recent = float(np.mean(losses[-log_every:]))
            log(f"step {step + 1:5d}/{steps}  loss {recent:.4f}")
    train_s = time.perf_counter() - t0

    accuracy = _accuracy(predict_fn, data.test_images, data.test_labels, batch_size)
    return TrainResult(losses, accuracy, step_fn.counters, trace_s, train_s)


def _batches(n: int, batch_size: int, seed: int) -> Any:
    """Endless minibatch indices: a new seeded shuffle per epoch."""
    rng = np.random.RandomState(seed + 1)
    while True:
        order = rng.permutation(n)
        for start in range(0, n - batch_size + 1, batch_size):
            yield order[start : start + batch_size]


def _accuracy(
    predict_fn: Any, images: np.ndarray, labels: np.ndarray, batch_size: int
) -> float:
    """Fraction of ``images`` classified right; pads the last batch (the compiled
    function has a fixed batch) and ignores the padding."""
    correct = 0
    for start in range(0, len(labels), batch_size):
        chunk = images[start : start + batch_size]
        n = len(chunk)
        if n < batch_size:
            pad = np.zeros((batch_size - n, *chunk.shape[1:]), np.float32)
            chunk = np.concatenate([chunk, pad])
        (logits,) = predict_fn(chunk)
        correct += int(
            np.sum(np.argmax(logits[:n], axis=1) == labels[start : start + n])
        )
    return correct / len(labels)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--mesh_shape", default="all:1", help='mesh dims, e.g. "rows:2;cols:2"'
    )
    parser.add_argument(
        "--layout", default="", help='layout rules, e.g. "batch:rows;hidden:cols"'
    )
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch_size", type=int, default=100)
    parser.add_argument("--hidden_size", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9, help="0 for plain SGD")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log_every", type=int, default=50)
    args = parser.parse_args(argv)

    print(
        f"digits: mesh [{args.mesh_shape}], layout [{args.layout or 'replicated'}], "
        f"{args.steps} steps of batch {args.batch_size}",
        flush=True,
    )
    try:
        result = train(
            mesh_shape=args.mesh_shape,
            layout=args.layout,
            steps=args.steps,
            batch_size=args.batch_size,
            lr=args.lr,
            momentum=args.momentum,
            seed=args.seed,
            hidden_size=args.hidden_size,
            log_every=args.log_every,
            log=lambda line: print(line, flush=True),
        )
    except ValueError as e:  # a bad option (mtf's errors are ValueErrors too)
        parser.error(str(e))  # one line, exit 2
    print(f"lowering (trace) {result.trace_seconds:.2f} s")
    print(
        f"training {result.train_seconds:.2f} s "
        f"({1000 * result.train_seconds / args.steps:.1f} ms/step)"
    )
    comm = {k: v for k, v in result.counters.items() if "/" in k and k.count("/") == 1}
    print(f"bytes per device per step by collective/axis: {comm or 'none'}")
    print(f"final test accuracy: {result.test_accuracy:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
