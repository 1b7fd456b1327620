"""Mesh TF's ``test_utils``: move values between NumPy, TF and mtf tensors.

``mesh_tensorflow.test_utils`` resolves here under :mod:`mtf_core.compat`.
The converter lowers on a one-device mesh; in TF1 graph mode it evaluates in
its own session after running the variable initializers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from mtf_core.errors import LoweringError
from mtf_core.graph import Graph, Mesh, Tensor
from mtf_core.lowering.lowering import Lowering
from mtf_core.lowering.placement import PlacementMeshImpl
from mtf_core.ops.creation import constant
from mtf_core.shapes import Dimension, Shape


class NumpyConverter:
    """Converts between ``mtf.Tensor``, ``tf.Tensor`` and NumPy arrays.

    >>> c = NumpyConverter()
    >>> x = c.convert_np_array_to_mtf_tensor(np.arange(6).reshape(2, 3))
    >>> c.convert_mtf_tensor_to_np_array(x).tolist()
    [[0, 1, 2], [3, 4, 5]]
    """

    def __init__(self) -> None:
        self._graph = Graph()
        self._mesh = Mesh(self._graph, "mtf_mesh")
        self._session = None if tf.executing_eagerly() else tf.compat.v1.Session()

    @property
    def graph(self) -> Graph:
        return self._graph

    @property
    def mesh(self) -> Mesh:
        return self._mesh

    @property
    def session(self) -> Any:
        return self._session

    def convert_np_array_to_mtf_tensor(
        self,
        x: np.ndarray,
        dim_names: Sequence[str] | None = None,
        dtype: Any = tf.int32,
    ) -> Tensor:
        """A constant on this converter's mesh; dims ``dim0, dim1, ...`` unless
        ``dim_names`` are given."""
        x = np.asarray(x)
        names = list(dim_names) if dim_names else [f"dim{i}" for i in range(x.ndim)]
        shape = Shape([Dimension(n, s) for n, s in zip(names, x.shape)])
        return constant(self._mesh, x, shape=shape, dtype=dtype)

    def convert_mtf_tensor_to_tf_tensor(self, mtf_tensor: Tensor) -> tuple[Any, Any]:
        """``(lowering, tf_tensor)``: ``mtf_tensor`` lowered on one device."""
        impl = PlacementMeshImpl(shape=[], layout={}, devices=[""])
        lowering = Lowering(self._graph, {self._mesh: impl})
        return lowering, lowering.export_to_tf_tensor(mtf_tensor)

    def convert_mtf_tensor_to_np_array(self, x_mtf: Tensor) -> np.ndarray:
        """The value of ``x_mtf`` as a NumPy array."""
        _, x_tf = self.convert_mtf_tensor_to_tf_tensor(x_mtf)
        if tf.executing_eagerly():
            return np.asarray(x_tf.numpy())
        session = self._session
        if session is None:
            raise LoweringError(
                "this NumpyConverter was made while TensorFlow executed eagerly, "
                "so it has no session for graph mode; make it in graph mode"
            )
        session.run(tf.compat.v1.global_variables_initializer())
        return np.asarray(session.run(x_tf))
