"""The MNIST example (examples/mnist.py): it learns, and layouts do not change it."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "mnist.py"
STEPS = 100
BATCH = 100


def _load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mnist_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def mnist() -> ModuleType:
    return _load_example()


def test_digits_split_uses_every_image_once_scaled_to_unit_range(
    mnist: ModuleType,
) -> None:
    from sklearn.datasets import load_digits

    data = mnist.load_digits(seed=0)
    assert data.train_images.shape[1:] == (8, 8)
    assert len(data.test_labels) == 359
    raw = load_digits()
    split = np.concatenate([data.train_images, data.test_images]) * 16.0
    labels = np.concatenate([data.train_labels, data.test_labels])

    def key(images: np.ndarray, ys: np.ndarray) -> list[tuple[int, bytes]]:
        return sorted(
            (int(y), im.astype(np.int64).tobytes()) for im, y in zip(images, ys)
        )

    assert key(split, labels) == key(raw.images, raw.target)
    assert 0.0 <= data.train_images.min() and data.train_images.max() <= 1.0
    assert set(np.unique(data.test_labels)) == set(range(10))
    assert data.train_labels.dtype == np.int32


@pytest.mark.tf
def test_mnist_2d_layout_reaches_90_percent_with_the_one_device_loss_curve(
    mnist: ModuleType, devices: list[str]
) -> None:
    one = mnist.train("all:1", "", steps=STEPS, batch_size=BATCH, devices=devices)
    two_d = mnist.train(
        "rows:2;cols:2",
        "batch:rows;hidden:cols",
        steps=STEPS,
        batch_size=BATCH,
        devices=devices,
    )

    assert two_d.test_accuracy >= 0.90
    assert len(two_d.losses) == STEPS
    assert two_d.losses[-1] < 0.5 * two_d.losses[0]
    np.testing.assert_allclose(two_d.losses, one.losses, rtol=1e-4, atol=1e-5)
    assert abs(two_d.test_accuracy - one.test_accuracy) <= 1 / 359 + 1e-9

    # One device talks to nobody.  On the 2x2 mesh, logits reduce the split
    # hidden dim over cols (a [50, 10] float32 slice); the w1 [8, 8, 512] and
    # w2 [512, 10] gradients and the mean loss reduce the split batch over rows.
    assert one.counters.collectives == []
    c = two_d.counters
    assert {r.kind for r in c.collectives} == {"allreduce"}
    assert c["allreduce/cols"] == 50 * 10 * 4
    assert c["allreduce/rows/Einsum"] == (8 * 8 * 512 + 512 * 10) * 4
    assert c["allreduce/rows/Reduce"] == 4
    assert len(c.of_kind("allreduce")) == 4


@pytest.mark.tf
def test_mnist_forward_pass_with_batch_only_layout_issues_no_collectives(
    mnist: ModuleType, devices: list[str]
) -> None:
    import mtf_core as mtf

    model = mnist.build_model(batch_size=8, hidden_size=32)
    impl = mtf.PlacementMeshImpl("all:4", "batch:all", devices[:4])
    forward = mtf.compile_function(
        model.graph,
        {model.mesh: impl},
        inputs=[model.images, model.labels],
        outputs=[model.logits, model.example_loss],
    )
    data = mnist.load_digits(seed=0)
    images, labels = data.test_images[:8], data.test_labels[:8]
    logits, example_loss = forward(images, labels)

    assert forward.counters is not None
    assert forward.counters.collectives == []
    assert forward.counters["flops_per_device"] > 0

    w1 = forward.variables.export(model.graph.operation_by_name("w1"))
    w2 = forward.variables.export(model.graph.operation_by_name("w2"))
    hidden = np.maximum(np.einsum("brc,rch->bh", images, w1), 0.0)
    want_logits = hidden @ w2
    shifted = want_logits - want_logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(logits, want_logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        example_loss, -log_probs[np.arange(8), labels], rtol=1e-5, atol=1e-5
    )


@pytest.mark.tf
def test_mnist_main_trains_from_flags_and_prints_accuracy(
    mnist: ModuleType, devices: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    rc = mnist.main(
        [
            "--mesh_shape",
            "all:2",
            "--layout",
            "hidden:all",
            "--steps",
            "4",
            "--batch_size",
            "16",
            "--hidden_size",
            "64",
            "--log_every",
            "2",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "step     4/4  loss" in out
    assert "allreduce/all" in out
    assert "final test accuracy: " in out


@pytest.mark.tf
def test_mnist_indivisible_batch_layout_names_batch_and_axis(
    mnist: ModuleType, devices: list[str]
) -> None:
    import mtf_core as mtf

    with pytest.raises(mtf.IndivisibleDimensionError, match=r"batch.*all") as err:
        mnist.train("all:3", "batch:all", steps=1, batch_size=100, devices=devices)
    assert isinstance(err.value, ValueError)


def test_mnist_rejects_nonpositive_steps_by_value(mnist: ModuleType) -> None:
    with pytest.raises(ValueError, match="steps must be positive, got 0"):
        mnist.train(steps=0)


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--steps", "0"], "steps must be positive, got 0"),
        (["--mesh_shape", "all:3", "--layout", "batch:all"], "batch"),
        (["--layout", "batch:nope"], "mesh dimension 'nope'"),
    ],
)
def test_mnist_main_says_a_bad_flag_in_one_line(
    mnist: ModuleType, devices: list[str], capsys, flags: list[str], said: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        mnist.main(flags)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err
    assert ": error: " in err.strip().splitlines()[-1]


def _readme_first_program() -> tuple[str, str]:
    """The python blocks of README's "A first program" section, and the output
    the README says they print."""
    text = (ROOT / "README.md").read_text()
    section = re.search(r"^## A first program\n(.*?)(?=^## )", text, re.M | re.S)
    assert section is not None, "README lost its '## A first program' section"
    blocks = re.findall(r"^```(\w*)\n(.*?)^```$", section.group(1), re.M | re.S)
    code = [body for lang, body in blocks if lang == "python"]
    shown = [body for lang, body in blocks if lang == ""]
    assert len(code) == 2 and len(shown) == 1, blocks
    return "\n".join(code), shown[0]


@pytest.mark.tf
def test_readme_first_program_prints_what_the_readme_shows(
    devices: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, shown = _readme_first_program()
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    printed = capsys.readouterr().out
    # Loss values are rounded to 4 places, which float32 rounding could flip.
    numbers = re.compile(r"\d+\.\d+")
    assert numbers.sub("#", printed).split() == numbers.sub("#", shown).split()
    got = [float(v) for v in numbers.findall(printed)]
    want = [float(v) for v in numbers.findall(shown)]
    np.testing.assert_allclose(got, want, atol=2e-4)
