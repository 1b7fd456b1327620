"""The weights a recomputed block hands between its two runs.

:func:`mtf_core.recompute.recompute_block` runs a block, noting every weight
tensor ``get_variable`` returns inside it (:func:`recorded_weights`), and in
the backward pass runs it again with ``get_variable`` handing those tensors
back by name (:func:`provided_variables`).  ``get_variable``
(:mod:`mtf_core.ops.variables`) asks :func:`provided` and calls
:func:`record`; this bookkeeping sits below both, so the op family and the
recomputation (which differentiates, through :mod:`mtf_core.autodiff`) do not
import each other.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Mapping

from mtf_core.errors import GraphError
from mtf_core.graph import Graph, Tensor
from mtf_core.shapes import Shape

_PROVIDED: weakref.WeakKeyDictionary[Graph, dict[str, Tensor]] = (
    weakref.WeakKeyDictionary()
)
_RECORDING: weakref.WeakKeyDictionary[Graph, list[dict[str, Tensor]]] = (
    weakref.WeakKeyDictionary()
)


@contextlib.contextmanager
def provided_variables(graph: Graph, tensors: Mapping[str, Tensor]) -> Iterator[None]:
    """While active, ``get_variable(mesh, name, ...)`` on ``graph`` returns
    ``tensors[name]`` (shape-checked) instead of creating a variable."""
    previous = _PROVIDED.get(graph)
    _PROVIDED[graph] = {**(previous or {}), **tensors}
    try:
        yield
    finally:
        if previous is None:
            _PROVIDED.pop(graph, None)
        else:
            _PROVIDED[graph] = previous


def provided(graph: Graph, name: str, shape: Shape) -> Tensor | None:
    """The tensor :func:`provided_variables` hands out for ``name``, or None."""
    table = _PROVIDED.get(graph)
    if not table or name not in table:
        return None
    t = table[name]
    if t.shape != shape:
        raise GraphError(
            f"recomputed block asks for variable {name!r} of shape [{shape}] but "
            f"the first run created it as [{t.shape}]"
        )
    return t


def record(graph: Graph, name: str, tensor: Tensor) -> None:
    """Notes that ``get_variable`` returned ``tensor`` for ``name`` (for
    :func:`recompute_block`)."""
    for frame in _RECORDING.get(graph, ()):
        frame[name] = tensor


@contextlib.contextmanager
def recorded_weights(graph: Graph) -> Iterator[dict[str, Tensor]]:
    """While active, every weight ``get_variable`` returns on ``graph`` is
    noted in the yielded ``{name: tensor}`` (innermost block first)."""
    frames = _RECORDING.setdefault(graph, [])
    frame: dict[str, Tensor] = {}
    frames.append(frame)
    try:
        yield frame
    finally:
        frames.pop()
