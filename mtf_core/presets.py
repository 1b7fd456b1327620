"""Ready-made layouts in the Mesh TensorFlow spirit, by name or by rule string.

================  ===========================================  ===============
name              rules                                        mesh (8 devices)
================  ===========================================  ===============
data-parallel     ``batch:all``                                ``all:8``
model-parallel    ``d_ff:all;heads:all;vocab:all``             ``all:8``
2d                ``batch:rows;d_ff:cols;heads:cols;vocab:cols``  ``rows:2;cols:4``
================  ===========================================  ===============

>>> choice = resolve_layout("2d", 8)
>>> str(choice.mesh_shape), str(choice.rules)
('rows:2,cols:4', 'batch:rows;d_ff:cols;heads:cols;vocab:cols')
>>> str(resolve_layout("batch:x", 4, mesh_shape="x:4").rules)
'batch:x'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mtf_core.errors import ConfigError, LayoutError
from mtf_core.layout import LayoutRules, check_layout_rules, convert_to_layout_rules
from mtf_core.shapes import Dimension, Shape, convert_to_shape


def _one_axis(n: int) -> Shape:
    return Shape([Dimension("all", n)])


def _two_axes(n: int) -> Shape:
    rows = 2 if n % 2 == 0 and n > 2 else 1
    return Shape([Dimension("rows", rows), Dimension("cols", n // rows)])


@dataclass(frozen=True)
class Preset:
    """A named layout: its rules and how to shape a mesh of ``n`` devices."""

    name: str
    rules: LayoutRules
    mesh_for: Callable[[int], Shape]
    description: str

    def mesh_shape(self, n_devices: int) -> Shape:
        if n_devices < 1:
            raise ConfigError(f"number of devices must be >= 1, got {n_devices!r}")
        return self.mesh_for(n_devices)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "data-parallel",
            convert_to_layout_rules("batch:all"),
            _one_axis,
            "split the batch over every device; weights replicated",
        ),
        Preset(
            "model-parallel",
            convert_to_layout_rules("d_ff:all;heads:all;vocab:all"),
            _one_axis,
            "split feed-forward, attention heads and vocabulary; batch replicated",
        ),
        Preset(
            "2d",
            convert_to_layout_rules("batch:rows;d_ff:cols;heads:cols;vocab:cols"),
            _two_axes,
            "batch over rows, model dims over cols",
        ),
    )
}
ALIASES = {"dp": "data-parallel", "mp": "model-parallel", "mixed": "2d", "2-d": "2d"}


@dataclass(frozen=True)
class LayoutChoice:
    """A mesh shape and layout rules, and the preset they came from (if any)."""

    mesh_shape: Shape
    rules: LayoutRules
    preset: str | None = None

    def __str__(self) -> str:
        return f"mesh {self.mesh_shape} layout {self.rules or '(replicated)'}"


def preset_names() -> list[str]:
    return sorted(PRESETS)


def get_preset(name: str) -> Preset:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in PRESETS:
        raise ConfigError(
            f"unknown layout preset {name!r}; expected one of {preset_names()} "
            f"(or a rule string such as 'batch:all')"
        )
    return PRESETS[key]


def resolve_layout(
    layout: str | LayoutRules | None, n_devices: int, mesh_shape: Any = None
) -> LayoutChoice:
    """Turns a preset name or a rule string into a mesh shape and rules.

    A preset supplies its own mesh shape for ``n_devices`` unless
    ``mesh_shape`` is given.  A rule string needs ``mesh_shape`` (or uses
    ``all:n_devices``).  The mesh must have exactly ``n_devices`` processors
    and the rules may only name its dims.
    """
    preset = None
    if isinstance(layout, str) and ":" not in layout and layout.strip():
        preset = get_preset(layout.strip())
        rules = preset.rules
        default_shape = preset.mesh_shape(n_devices)
    else:
        rules = convert_to_layout_rules(layout)
        default_shape = _one_axis(n_devices)
    shape = default_shape if mesh_shape is None else convert_to_shape(mesh_shape)
    if shape.size != n_devices:
        raise ConfigError(
            f"mesh [{shape}] has {shape.size} processors but {n_devices} devices "
            "are in use; pick a mesh whose sizes multiply to the device count"
        )
    try:
        check_layout_rules(rules, shape)
    except LayoutError as e:
        hint = f" (preset {preset.name!r})" if preset else ""
        raise LayoutError(f"{e}{hint}") from None
    return LayoutChoice(shape, rules, preset.name if preset else None)
