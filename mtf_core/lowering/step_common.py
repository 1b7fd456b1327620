"""What both compiled-step backends share: the step's attributes and the
arity check (:mod:`compiled` for placement, :mod:`spmd_compiled` for SPMD;
neither imports the other, :mod:`steps` chooses between them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mtf_core.errors import LoweringError
from mtf_core.graph import Graph, Mesh, Operation, Tensor
from mtf_core.lowering.variables import VariableStore
from mtf_core.ops.creation import ImportTensor


def init_step_state(
    step: Any,
    graph: Graph,
    mesh_to_impl: Mapping[Mesh, Any],
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor],
    updates: Sequence[Operation],
    variables: VariableStore | None,
) -> None:
    """Sets the attributes every compiled step has (both backends), checking that
    the inputs are placeholders and making the variable store if none is given."""
    step.graph = graph
    step.mesh_to_impl = dict(mesh_to_impl)
    step.inputs = list(inputs)
    step.outputs = list(outputs)
    step.updates = list(updates)
    for t in step.inputs:
        if not (isinstance(t.operation, ImportTensor) and t.operation.is_placeholder):
            raise LoweringError(
                f"input {t.name} is not a placeholder (mtf.placeholder)"
            )
    step.variables = (
        variables if variables is not None else VariableStore(graph, step.mesh_to_impl)
    )
    step.counters = None


def check_arity(step: Any, values: Sequence[Any]) -> None:
    """Raises unless ``values`` has one value per input placeholder of ``step``."""
    if len(values) != len(step.inputs):
        raise LoweringError(
            f"compiled function takes {len(step.inputs)} inputs "
            f"({[t.name for t in step.inputs]}), got {len(values)}"
        )
