"""Layout rules: which tensor dimensions are split over which mesh dimensions.

Transition table (what the lowering does when a tensor's layout changes):

* split(a on m)  -> replicated       : allconcat over m
* partial-sum    -> replicated       : allreduce over the partial axes
* replicated     -> split(a on m)    : allsplit (local slicing, no communication)
* split(a on m)  -> split(b on m)    : alltoall over m

>>> rules = convert_to_layout_rules("c:m1;a:m2")
>>> str(rules)
'a:m2;c:m1'
>>> rules.tensor_layout("a:10,b:5", "m1:4,m2:2")
TensorLayout((1, None))
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from mtf_core.errors import IndivisibleDimensionError, LayoutError
from mtf_core.shapes import Shape, convert_to_shape, is_dimension_name, tight_colons

_RULE_SEPARATORS = re.compile(r"[,;.\s]+")


@dataclass(frozen=True)
class TensorLayout:
    """For each tensor axis, the mesh axis it is split over (or None)."""

    tensor_axis_to_mesh_axis: tuple[int | None, ...]

    def __post_init__(self) -> None:
        # A list (as Mesh TF programs pass) compares and hashes as its tuple.
        axes = self.tensor_axis_to_mesh_axis
        if not isinstance(axes, tuple):
            object.__setattr__(self, "tensor_axis_to_mesh_axis", tuple(axes))

    def __repr__(self) -> str:
        return f"TensorLayout({self.tensor_axis_to_mesh_axis})"

    def __iter__(self) -> Iterator[int | None]:
        return iter(self.tensor_axis_to_mesh_axis)

    def __len__(self) -> int:
        return len(self.tensor_axis_to_mesh_axis)

    def __getitem__(self, i: int) -> int | None:
        return self.tensor_axis_to_mesh_axis[i]

    @property
    def is_fully_replicated(self) -> bool:
        return all(m is None for m in self.tensor_axis_to_mesh_axis)

    def mesh_axis_to_tensor_axis(self, mesh_ndims: int) -> tuple[int | None, ...]:
        out: list[int | None] = [None] * mesh_ndims
        for t, m in enumerate(self.tensor_axis_to_mesh_axis):
            if m is not None and m < mesh_ndims:  # axes past mesh_ndims: none
                out[m] = t
        return tuple(out)


@dataclass(frozen=True, init=False)
class LayoutRules:
    """A set of ``(tensor_dim_name, mesh_dim_name)`` pairs, sorted canonically.

    A tensor dimension name may appear in at most one rule.
    """

    pairs: tuple[tuple[str, str], ...]

    def __init__(self, pairs: Iterable[tuple[str, str]] = ()) -> None:
        canonical = tuple(sorted({_rule(t, m) for t, m in pairs}))
        seen: dict[str, str] = {}
        for t, m in canonical:
            if t in seen:
                raise LayoutError(
                    f"tensor dimension {t!r} is split over two mesh dimensions "
                    f"({seen[t]!r} and {m!r}); a tensor dimension may be split over "
                    "at most one mesh dimension"
                )
            seen[t] = m
        object.__setattr__(self, "pairs", canonical)

    @property
    def _pairs(self) -> set[tuple[str, str]]:
        """The rules as a set (Mesh TF's attribute, which its tests read)."""
        return set(self.pairs)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self.pairs)

    def __len__(self) -> int:
        return len(self.pairs)

    def __str__(self) -> str:
        return ";".join(f"{t}:{m}" for t, m in self.pairs)

    def __repr__(self) -> str:
        return f"LayoutRules('{self}')"

    def as_dict(self) -> dict[str, str]:
        return dict(self.pairs)

    def mesh_dimension_name(self, tensor_dim_name: str) -> str | None:
        for t, m in self.pairs:
            if t == tensor_dim_name:
                return m
        return None

    def mesh_dimension_name_to_tensor_dimension_names(self, mesh_dim: str) -> list[str]:
        return [t for t, m in self.pairs if m == mesh_dim]

    def tensor_dimension_to_mesh_axis(
        self, tensor_dimension: Any, mesh_shape: Any
    ) -> int | None:
        """Mesh axis index the dimension is split over, or None."""
        mesh_shape = convert_to_shape(mesh_shape)
        name = (
            tensor_dimension
            if isinstance(tensor_dimension, str)
            else tensor_dimension.name
        )
        m = self.mesh_dimension_name(name)
        if m is None or m not in mesh_shape.dimension_names:
            return None
        index: int = mesh_shape.dimension_names.index(m)
        return index

    def tensor_layout(self, tensor_shape: Any, mesh_shape: Any) -> TensorLayout:
        """The layout of a tensor of ``tensor_shape`` on ``mesh_shape``.

        Raises LayoutError when two dims of the tensor land on one mesh axis and
        IndivisibleDimensionError when a size does not divide.
        """
        tensor_shape = convert_to_shape(tensor_shape)
        mesh_shape = convert_to_shape(mesh_shape)
        axes: list[int | None] = []
        used: dict[int, str] = {}
        for d in tensor_shape:
            m = self.tensor_dimension_to_mesh_axis(d, mesh_shape)
            if m is not None:
                mesh_dim = mesh_shape[m]
                if m in used:
                    raise LayoutError(
                        f"tensor [{tensor_shape}] would split both {used[m]!r} and "
                        f"{d.name!r} over mesh dimension {mesh_dim.name!r} of size "
                        f"{mesh_dim.size}; two dimensions of one tensor cannot share "
                        "a mesh dimension"
                    )
                if d.size % mesh_dim.size:
                    raise IndivisibleDimensionError(
                        f"dimension {d.name!r} of size {d.size} is not divisible by "
                        f"mesh dimension {mesh_dim.name!r} of size {mesh_dim.size}"
                    )
                used[m] = d.name
            axes.append(m)
        return TensorLayout(tuple(axes))


def _rule(tensor_dim: Any, mesh_dim: Any) -> tuple[str, str]:
    """One rule's names, if both can name a dimension: a rule naming
    anything else (``5``, ``"rows:cols"``) could never apply."""
    for name in (tensor_dim, mesh_dim):
        if not isinstance(name, str) or not is_dimension_name(name):
            raise LayoutError(
                f"layout rule ({tensor_dim!r}, {mesh_dim!r}) names {name!r}, which "
                "is not a dimension name; expected 'tensor_dim:mesh_dim' such as "
                "'batch:rows'"
            )
    return tensor_dim, mesh_dim


#: What :func:`convert_to_layout_rules` accepts (None: no rules).
LayoutRulesLike = (
    LayoutRules | str | Mapping[str, str] | Iterable[tuple[str, str]] | None
)


def convert_to_layout_rules(x: Any) -> LayoutRules:
    """Accepts LayoutRules, ``"a:m1;b:m2"`` (``,`` ``;`` ``.`` or spaces) or pairs."""
    if isinstance(x, LayoutRules):
        return x
    if x is None:
        return LayoutRules()
    if isinstance(x, str):
        pairs = []
        for part in _RULE_SEPARATORS.split(tight_colons(x.strip())):
            if not part:
                continue
            t, sep, m = part.partition(":")
            if not sep or not t or not m or ":" in m:
                raise LayoutError(
                    f"layout rule {part!r} is malformed; expected 'tensor_dim:mesh_dim'"
                )
            pairs.append((t, m))
        return LayoutRules(pairs)
    if isinstance(x, dict):
        return LayoutRules(x.items())
    try:
        pairs = [(t, m) for t, m in x]
    except (TypeError, ValueError):
        raise LayoutError(
            f"cannot convert {x!r} to layout rules; expected 'a:m1;b:m2' or pairs"
        ) from None
    return LayoutRules(pairs)


def check_layout_rules(rules: LayoutRules, mesh_shape: Shape) -> None:
    """Raises LayoutError if a rule names a mesh dimension that does not exist."""
    names = set(mesh_shape.dimension_names)
    for t, m in rules:
        if m not in names:
            raise LayoutError(
                f"layout rule {t}:{m} names mesh dimension {m!r}, which mesh "
                f"[{mesh_shape}] does not have"
            )


def tensor_dim_to_mesh_dim_size(layout: Any, mesh_shape: Any, tensor_dim: Any) -> int:
    """How many ways ``layout`` splits ``tensor_dim`` on ``mesh_shape`` (1 if
    not at all), for graphs that size themselves by their future layout.

    >>> tensor_dim_to_mesh_dim_size("batch:rows", "rows:2;cols:4", "batch")
    2
    """
    mesh = convert_to_shape(mesh_shape)
    axis = convert_to_layout_rules(layout).tensor_dimension_to_mesh_axis(
        tensor_dim, mesh
    )
    return 1 if axis is None else mesh.dims[axis].size


def tensor_dim_to_size_per_split(layout: Any, mesh_shape: Any, tensor_dim: Any) -> int:
    """The size of ``tensor_dim`` on each device under ``layout``."""
    ways = tensor_dim_to_mesh_dim_size(layout, mesh_shape, tensor_dim)
    if tensor_dim.size % ways:
        raise IndivisibleDimensionError(
            f"dimension {tensor_dim} is not divisible by the {ways} devices it is "
            "split over"
        )
    return int(tensor_dim.size // ways)
