"""Mesh TF's TF1 training-loop pieces: session hooks that keep master
variables (what a ``tf.compat.v1.train.Saver`` saves) and slices in step.

``MtfRestoreHook`` copies masters to slices once the session exists (after a
checkpoint restore or the initializers); ``MtfCheckpointSaverListener`` copies
slices to masters before each save.  See :mod:`mtf_core.lowering.masters`.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf


class MtfRestoreHook(tf.compat.v1.train.SessionRunHook):  # type: ignore[misc]
    """Copies master variables to slices when the session is created."""

    def __init__(self, lowering: Any) -> None:
        self._lowering = lowering
        self._op: Any = None

    def begin(self) -> None:
        self._op = self._lowering.copy_masters_to_slices()

    def after_create_session(self, session: Any, coord: Any) -> None:
        session.run(self._op)


class MtfCheckpointSaverListener(tf.compat.v1.train.CheckpointSaverListener):  # type: ignore[misc]
    """Copies slices to master variables before each checkpoint is saved."""

    def __init__(self, lowering: Any) -> None:
        self._lowering = lowering
        self._op: Any = None

    def begin(self) -> None:
        self._op = self._lowering.copy_slices_to_masters()

    def before_save(self, session: Any, global_step_value: Any) -> None:
        session.run(self._op)
