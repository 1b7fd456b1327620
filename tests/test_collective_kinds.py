"""Collective kinds and reductions are enums (StrEnum): one spelling each,
checked where a spec or record is made, still equal to their strings."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mtf_core.comm import CollectiveKind, CollectiveSpec, LayoutStep, Reduction
from mtf_core.lowering.counters import CollectiveRecord

ROOT = Path(__file__).resolve().parent.parent


def test_kinds_are_canonical_members_equal_to_their_strings() -> None:
    spec = CollectiveSpec("allreduce", ("x",), 4, reduction="MAX")
    assert spec.kind is CollectiveKind.ALLREDUCE and spec.kind == "allreduce"
    assert spec.reduction is Reduction.MAX
    assert json.dumps([spec.kind, spec.reduction]) == '["allreduce", "MAX"]'
    rec = CollectiveRecord("reducescatter", ("y",), 64, "g", "ReduceScatter")
    assert rec.kind is CollectiveKind.REDUCE_SCATTER and rec.reduction == ""
    assert LayoutStep("alltoall", 0, 1, 0, 8).kind is CollectiveKind.ALLTOALL


@pytest.mark.parametrize(
    "make",
    [
        lambda: CollectiveSpec("allgather", ("x",), 4),
        lambda: CollectiveSpec("allreduce", ("x",), 4, reduction="sum"),
        lambda: CollectiveRecord("reduce_scatter", ("y",), 64, "g", "ReduceScatter"),
        lambda: LayoutStep("gather", 0, None, 0, 8),
    ],
)
def test_an_unknown_kind_or_reduction_is_an_error_where_it_is_made(make) -> None:
    with pytest.raises(ValueError, match="is not a valid"):
        make()


def test_every_kind_the_backends_record_is_a_collective_kind() -> None:
    # Both backends record reduce-scatter as one kind (SPMD used to say
    # "reduce_scatter", placement and the cost model "reducescatter").
    literal = re.compile(r"""(?:\brecord|CollectiveSpec)\(\s*["']([a-z_]+)["']""")
    found = {
        (path.name, kind)
        for path in (ROOT / "mtf_core").rglob("*.py")
        for kind in literal.findall(path.read_text())
    }
    assert found, "the scan found no record() calls"
    bad = sorted((f, k) for f, k in found if k not in set(CollectiveKind))
    assert bad == []


def test_cost_unit_and_memory_kinds_are_enums_equal_to_their_strings() -> None:
    from cost_models.memory import ACTIVATION, MemoryKind
    from cost_models.units import DEFERRED, OP, UnitKind

    assert OP is UnitKind.OP and OP == "op" and DEFERRED == "deferred"
    assert ACTIVATION is MemoryKind.ACTIVATION and ACTIVATION == "activation"
    assert {MemoryKind.PARAM: 1}["param"] == 1  # dict keys read as strings too
    with pytest.raises(ValueError):
        MemoryKind("weights")
