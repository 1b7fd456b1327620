"""What a laid-out tensor is on the SPMD backend, and the replica context.

Inside a per-replica program a laid-out tensor is one tensor, this device's
slice (:class:`ReplicaTensor`).  Outside one (eager lowering, the variable
store) it is this process's slices by pnum (:class:`LocalSlices`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


class ReplicaTensor:
    """This device's slice of an mtf tensor, inside a per-replica program."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor

    def to_laid_out_tensor(self) -> ReplicaTensor:
        return self

    @property
    def slice_bytes(self) -> int:
        return int(self.tensor.shape.num_elements() * self.tensor.dtype.size)

    def __repr__(self) -> str:
        return f"ReplicaTensor({self.tensor.shape}, {self.tensor.dtype.name})"


class LocalSlices:
    """This process's slices of an mtf tensor, by pnum (None: another process's)."""

    __slots__ = ("slices",)

    def __init__(self, slices: Sequence[Any]) -> None:
        self.slices = list(slices)

    def to_laid_out_tensor(self) -> LocalSlices:
        return self

    @property
    def first(self) -> Any:
        return next(s for s in self.slices if s is not None)

    @property
    def slice_bytes(self) -> int:
        s = self.first
        return int(s.shape.num_elements() * s.dtype.size)

    def __repr__(self) -> str:
        n = sum(s is not None for s in self.slices)
        return f"LocalSlices({n} of {len(self.slices)} x {self.first.shape})"


@dataclass
class Replica:
    """What the program being traced knows about the device running it."""

    pnum: Any  # scalar int32 tensor
    token: Any  # resource ordering this device's collectives
    handles: dict[str, Any] = field(default_factory=dict)  # opened, by name

    def open(self, name: str, opener: Callable[[], Any]) -> Any:
        """One handle per named resource per program: automatic control
        dependencies order the ops that share it (a read before an assign)."""
        if name not in self.handles:
            self.handles[name] = opener()
        return self.handles[name]


def wrap_replica(value: Any) -> Any:
    """A replica function's result (a tensor or a tuple) as ReplicaTensors."""
    if isinstance(value, (tuple, list)):
        return type(value)(ReplicaTensor(v) for v in value)
    return ReplicaTensor(value)


def local_slices_of(per_device: dict[int, Any], size: int) -> Any:
    """``{pnum: result}`` (a tensor or a tuple) as LocalSlices, pnum-indexed."""
    first = next(iter(per_device.values()))
    if isinstance(first, (tuple, list)):
        return type(first)(
            local_slices_of({p: v[i] for p, v in per_device.items()}, size)
            for i in range(len(first))
        )
    slices: list[Any] = [None] * size
    for p, v in per_device.items():
        slices[p] = v
    return LocalSlices(slices)
