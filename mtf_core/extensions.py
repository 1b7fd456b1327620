"""The seam through which packages above mtf_core add names to ``mtf``.

``import mtf_core as mtf`` is the language, and the bottom layer: it imports
nothing above it (import-linter checks this, ``.importlinter``).  A few names
users expect on ``mtf`` come from higher layers: ``mtf.auto_layout``,
``mtf.auto_mtf`` and ``mtf.PlanOptions`` are the layout planner's (and
``auto_layout(..., server=URL)`` the planner service client's).  Those
packages *declare* what they provide, as entry points of the group
``mtf_core.extensions`` in ``pyproject.toml``::

    [project.entry-points."mtf_core.extensions"]
    auto_layout = "api.client:auto_layout"
    auto_mtf = "layout_planner.auto_mtf"

and ``mtf_core`` loads one the first time its name is used.  The dependency
so points from the upper package to this seam, never from mtf_core upward;
an install without the planner simply has no ``mtf.auto_layout``.
:func:`register` adds a name at run time (a tool, or a source tree that was
not installed with ``pip install -e .``).
"""

from __future__ import annotations

import functools
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from mtf_core.errors import MtfError

#: The entry point group upper packages declare their names in.
GROUP = "mtf_core.extensions"

_registered: dict[str, Any] = {}


class ExtensionError(MtfError, AttributeError):
    """A name no installed package provides to ``mtf``."""


@functools.cache
def _declared() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def names() -> frozenset[str]:
    """Every name an installed package declares or :func:`register` added."""
    return frozenset(_declared()) | frozenset(_registered)


def register(name: str, value: Any) -> None:
    """Makes ``mtf.<name>`` return ``value`` (it wins over a declared one)."""
    if not name.isidentifier():
        raise ExtensionError(f"extension name {name!r} is not a Python identifier")
    _registered[name] = value


def load(name: str) -> Any:
    """The value of extension ``name``: registered, or its entry point loaded."""
    if name in _registered:
        return _registered[name]
    ep = _declared().get(name)
    if ep is None:
        raise ExtensionError(
            f"module 'mtf_core' has no attribute {name!r}, and no installed package "
            f"provides it (entry point group {GROUP!r}; known: {sorted(names())})"
        )
    value = ep.load()
    _registered[name] = value
    return value
