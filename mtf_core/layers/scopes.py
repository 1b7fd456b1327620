"""How a layer names its weights.

mtf_core's layers name a weight after the layer and its part,
``{layer}_{part}`` (``proj_kernel``), and an unnamed layer after its kind
(``dense_kernel``): two calls of one name share their weights, which the
model builders and :func:`mtf_core.recompute.recompute_block` rely on.

Mesh TF's layers open ``tf.variable_scope(name, default_name=kind)`` instead
and name the weight by its part under it (``proj/kernel``), so each unnamed
call gets a scope of its own (``dense``, ``dense_1``, ...) and its own
weights.  The compatibility layer (:mod:`mtf_core.compat.layers`) runs the
calls a Mesh TF program makes under :func:`scopes_opened_by`, and
:func:`layer_scope` then opens its scopes; nothing else changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar

#: ``opener(name, default)``: the scope a layer called ``name`` (None: unnamed,
#: of kind ``default``) opens for its weights.
Opener = Callable[[str | None, str], AbstractContextManager[object]]

_OPENER: ContextVar[Opener | None] = ContextVar("mtf_layer_scope_opener", default=None)


@contextmanager
def layer_scope(name: str | None, default: str) -> Iterator[Callable[[str], str]]:
    """The scope of a layer called ``name`` (None: unnamed, of kind
    ``default``); yields ``weight(part)``, its weight's variable name.

    >>> with layer_scope(None, "dense") as weight:
    ...     weight("kernel")
    'dense_kernel'
    """
    opener = _OPENER.get()
    if opener is None:
        layer = name or default
        yield lambda part: f"{layer}_{part}"
        return
    with opener(name, default):
        yield lambda part: part


@contextmanager
def scopes_opened_by(opener: Opener) -> Iterator[None]:
    """Inside, :func:`layer_scope` opens ``opener(name, default)`` and names
    each weight by its part alone."""
    token = _OPENER.set(opener)
    try:
        yield
    finally:
        _OPENER.reset(token)
