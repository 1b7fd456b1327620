"""Errors raised by mtf_core.

Every error derives from :class:`MtfError` and also from the builtin that best
describes it, so ``except ValueError`` keeps working for code written against
Mesh TensorFlow.  Messages name the offending value and say what was expected.
"""

from __future__ import annotations


class MtfError(Exception):
    """Base class of every error this package raises on purpose."""


class ShapeError(MtfError, ValueError):
    """A dimension or shape is malformed, or shapes do not agree."""


class ShapeTypeError(ShapeError, TypeError):
    """A value of a type that cannot be a dimension or shape (e.g. ``5``);
    a TypeError too, as in Mesh TensorFlow."""


class LayoutError(MtfError, ValueError):
    """Layout rules are malformed or illegal for a tensor on a mesh."""


class IndivisibleDimensionError(LayoutError):
    """A tensor dimension's size is not divisible by its mesh dimension's size."""


class ArgumentError(MtfError, ValueError):
    """An op's argument is outside what the op accepts (an unknown reduction or
    distribution, a probability outside its range, a bound, a seed)."""


class DTypeError(MtfError, TypeError):
    """A dtype is unknown, or two tensors' dtypes do not agree."""


class GraphError(MtfError, ValueError):
    """Tensors from different graphs or meshes are mixed, or a name is bad."""


class GraphTypeError(GraphError, TypeError):
    """A value of a type that cannot be a graph (or graph part) where one is
    expected; a TypeError too, as in Mesh TensorFlow."""


class LoweringError(MtfError, ValueError):
    """The graph cannot be lowered with the given mesh implementations."""


class SerializationError(MtfError, ValueError):
    """A serialized graph is malformed or has an unsupported version."""


class ConfigError(MtfError, ValueError):
    """A configuration value (hyperparameter, model size, CLI option) is invalid."""
