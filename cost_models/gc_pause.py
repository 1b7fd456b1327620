"""Pausing Python's cyclic garbage collector around allocation-heavy walks.

Walking a deep graph allocates hundreds of thousands of small tuples and
lists, almost none of them in reference cycles.  Each allocation burst
triggers collections, and every third-generation collection visits every
object the graph holds: at 64 layers that is about a third of the time the
planner spends on the graph.  Reference counting still frees everything as
usual; cycles made meanwhile are collected once the pause ends.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Disables automatic cyclic collection inside the block; restores the
    previous state (a caller that disabled it keeps it disabled)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
