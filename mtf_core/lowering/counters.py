"""What a lowering did: every collective and the flops per device.

``bytes_per_device`` is always the size of the slice each device contributes
to the collective (its local input slice; for a shift, the slice it sends).
``allsplit`` moves no data and is not recorded.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from mtf_core.comm import CollectiveKind, Reduction


@dataclass(frozen=True)
class CollectiveRecord:
    """One collective the lowering issued."""

    kind: str  # a mtf_core.comm.CollectiveKind (canonicalized)
    mesh_axes: tuple[str, ...]
    bytes_per_device: int
    op_name: str
    op_type: str
    reduction: str = ""  # a mtf_core.comm.Reduction, or "" when none applies

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", CollectiveKind(self.kind))
        if self.reduction:
            object.__setattr__(self, "reduction", Reduction(self.reduction))

    @property
    def axes_key(self) -> str:
        return ",".join(self.mesh_axes)


class Counters(Mapping[str, float]):
    """Records collectives and flops; reads like Mesh TensorFlow's summed counters.

    Keys: ``"allreduce"``, ``"allreduce/model"``, ``"allreduce/model/einsum"``
    (kind, kind/axes, kind/axes/op_type) summed bytes per device, and
    ``"flops_per_device"``.
    """

    def __init__(self) -> None:
        self.collectives: list[CollectiveRecord] = []
        self.flops_per_device: dict[str, float] = {}
        self._sums: dict[str, float] = {}

    def record_collective(self, record: CollectiveRecord) -> None:
        self.collectives.append(record)
        for key in (
            record.kind,
            f"{record.kind}/{record.axes_key}",
            f"{record.kind}/{record.axes_key}/{record.op_type}",
        ):
            self._sums[key] = self._sums.get(key, 0) + record.bytes_per_device

    def record_flops(self, op_name: str, flops: float) -> None:
        self.flops_per_device[op_name] = self.flops_per_device.get(op_name, 0.0) + flops
        self._sums["flops_per_device"] = self._sums.get("flops_per_device", 0.0) + flops

    def of_kind(self, kind: str) -> list[CollectiveRecord]:
        return [c for c in self.collectives if c.kind == kind]

    def __getitem__(self, key: str) -> float:
        return self._sums[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._sums)

    def __len__(self) -> int:
        return len(self._sums)

    def summary(self) -> str:
        return "\n".join(f"{k}: {v:g}" for k, v in sorted(self._sums.items()))
