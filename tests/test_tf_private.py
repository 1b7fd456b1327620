"""TensorFlow's private APIs stay behind mtf_core/lowering/tf_private.py: a
version guard, a public road selected by MTF_TF_PUBLIC_ONLY=1, and the same
training step on both roads."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from test_fast_lowering import PLACED_2D
from test_lowering import _batches, _training_step

from mtf_core.lowering import tf_private

pytestmark = pytest.mark.tf

ROOT = Path(__file__).resolve().parent.parent
PRIVATE_NAMES = re.compile(
    r"_create_op_internal|_set_device|_control_dependencies_stack|"
    r"_get_control_flow_context|_add_control_inputs|tensorflow\.python"
)


def test_tensorflow_is_a_version_the_private_road_was_checked_on() -> None:
    assert tf_private.version_checked(), (
        f"TensorFlow {tf.__version__} is not in tf_private.KNOWN_GOOD_TF "
        f"{tf_private.KNOWN_GOOD_TF}: mtf_core's private TF calls were never checked "
        "on it.  Run the suite with MTF_TF_PUBLIC_ONLY=1 and without, compare "
        "(tests/test_tf_private.py), then add the version."
    )


def test_private_tensorflow_names_appear_only_in_tf_private() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{i}"
        for package in ("mtf_core", "cost_models", "layout_planner", "api")
        for path in (ROOT / package).rglob("*.py")
        if path.name != "tf_private.py"
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if PRIVATE_NAMES.search(line) and not line.lstrip().startswith(("#", "``"))
    ]
    assert offenders == []


def test_an_unchecked_version_or_the_flag_takes_the_public_road(monkeypatch) -> None:
    monkeypatch.delenv(tf_private.PUBLIC_ENV, raising=False)
    assert tf_private.private_road()
    monkeypatch.setenv(tf_private.PUBLIC_ENV, "1")
    assert not tf_private.private_road()
    monkeypatch.delenv(tf_private.PUBLIC_ENV)
    monkeypatch.setattr(tf_private, "KNOWN_GOOD_TF", ("0.1",))
    monkeypatch.setattr(tf_private, "_warned", set())
    with pytest.warns(RuntimeWarning, match="not among the versions"):
        assert not tf_private.private_road()


def _step_on_road(monkeypatch, devices, public: bool) -> dict:
    if public:
        monkeypatch.setenv(tf_private.PUBLIC_ENV, "1")
    else:
        monkeypatch.delenv(tf_private.PUBLIC_ENV, raising=False)
    calls: Counter[str] = Counter()
    for name in ("create_op", "set_device", "add_control_inputs"):
        real = getattr(tf_private, name)

        def spy(*a, _real=real, _name=name, **k):
            calls[_name] += 1
            return _real(*a, **k)

        monkeypatch.setattr(tf_private, name, spy)
    fn, (w1, w2) = _training_step(PLACED_2D, devices)
    losses = [fn(*b)[0] for b in _batches(3)]
    ops = fn.concrete.graph.get_operations()
    return {
        "losses": losses,
        "weights": [fn.variables.export(w) for w in (w1, w2)],
        "collectives": [
            (c.kind, c.axes_key, c.bytes_per_device) for c in fn.counters.collectives
        ],
        "einsum_devices": sorted(op.device for op in ops if op.type == "Einsum"),
        "calls": calls,
    }


def test_a_training_step_is_the_same_on_both_roads(monkeypatch, devices) -> None:
    private = _step_on_road(monkeypatch, devices, public=False)
    public = _step_on_road(monkeypatch, devices, public=True)
    np.testing.assert_allclose(public["losses"], private["losses"], rtol=1e-6)
    for a, b in zip(public["weights"], private["weights"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert public["collectives"] == private["collectives"]
    assert public["einsum_devices"] == private["einsum_devices"]
    assert len(set(private["einsum_devices"])) == 8  # on every device
    # the private road used the private calls; the public road none of them
    assert all(
        private["calls"][n] > 0
        for n in ("create_op", "set_device", "add_control_inputs")
    )
    assert sum(public["calls"].values()) == 0
