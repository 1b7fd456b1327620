"""Named dimensions and shapes.

A :class:`Dimension` is a ``(name, size)`` pair; a :class:`Shape` is an ordered
tuple of dimensions with distinct names.  Mesh shapes are shapes too.  Strings
are parsed here, once: ``"batch:32,hidden:1024"``, ``"x:2;y:4"`` (separators
``,`` ``;`` ``.`` and whitespace).

>>> convert_to_shape("a:10, b:5")
Shape('a:10,b:5')
>>> str(convert_to_shape("x:2;y:4").dims[1])
'y:4'
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, SupportsIndex, overload

import numpy as np

from mtf_core.errors import ShapeError, ShapeTypeError

_SEPARATORS = re.compile(r"[,;.\s]+")
#: A colon and the blanks around it ("x : 2" is the dimension "x:2").
_COLON = re.compile(r"\s*:\s*")
#: A size as written in a string: ASCII digits (int() would also take "2_0",
#: "+2" and other scripts' digits).
_SIZE = re.compile(r"-?[0-9]+")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-/]*$")
#: A size with a decimal point, as in "x:2.5" (after :func:`tight_colons`).
_DECIMAL_SIZE = re.compile(r"[A-Za-z_][A-Za-z0-9_\-/]*:(-?[0-9]*\.[0-9]+)")


@dataclass(frozen=True)
class Dimension:
    """A named tensor (or mesh) dimension of a positive size."""

    name: str
    size: int

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ShapeError(
                f"dimension name {self.name!r} is invalid; expected a non-empty "
                "identifier such as 'batch' or 'd_model'"
            )
        size = self.size
        if isinstance(size, bool) or not isinstance(size, int):
            is_bool = isinstance(size, (bool, np.bool_)) or (
                getattr(getattr(size, "dtype", None), "kind", "") == "b"
            )
            try:
                as_int = int(size)  # numpy integers
            except (TypeError, ValueError, OverflowError):  # OverflowError: inf
                as_int = None
            # A bool (NumPy's too) is no size, though int(True) is 1.
            if as_int is None or is_bool or as_int != size:
                raise ShapeError(
                    f"dimension {self.name!r} has size {size!r}; expected an integer"
                )
            object.__setattr__(self, "size", as_int)
        if self.size <= 0:
            raise ShapeError(
                f"dimension {self.name!r} has size {self.size}; expected a size >= 1"
            )

    def __str__(self) -> str:
        return f"{self.name}:{self.size}"


DimensionLike = Dimension | tuple[str, int] | str


def is_dimension_name(name: str) -> bool:
    """Whether ``name`` can name a dimension (of a tensor or a mesh)."""
    return bool(_NAME.match(name))


def convert_to_dimension(d: Any) -> Dimension | None:
    """Converts ``Dimension``, ``(name, size)`` or ``"name:size"`` to a Dimension.

    ``None`` passes through (Mesh TensorFlow does the same).
    """
    if d is None or isinstance(d, Dimension):
        return d
    if isinstance(d, str):
        name, sep, size = d.strip().partition(":")
        if not sep:
            raise ShapeError(f"dimension {d!r} has no size; expected 'name:size'")
        if not _SIZE.fullmatch(size.strip()):
            raise ShapeError(
                f"dimension {d!r} has size {size!r}; expected an integer written "
                "in the digits 0-9"
            )
        return Dimension(name.strip(), int(size))
    if isinstance(d, (tuple, list)) and len(d) == 2:
        return Dimension(d[0], d[1])
    raise ShapeTypeError(
        f"cannot convert {d!r} to a Dimension; expected Dimension, (name, size) "
        "or 'name:size'"
    )


def dimension_name(d: Any) -> str:
    """The name of a dimension given as a Dimension, ``"name"``, ``"name:size"``
    or ``(name, size)``."""
    if isinstance(d, str) and ":" not in d:
        return d.strip()
    dim = convert_to_dimension(d)
    if dim is None:
        raise ShapeError("expected a dimension or a dimension name, got None")
    return dim.name


class Dims(tuple[Dimension, ...]):
    """A shape's dimensions: an immutable tuple that also adds and compares
    with lists, since Mesh TF programs treat ``shape.dims`` as a list
    (``x.shape.dims[:-1] + [new_dim]``).

    >>> d = Dims([Dimension("a", 2)])
    >>> [str(x) for x in d + [Dimension("b", 3)]]
    ['a:2', 'b:3']
    >>> d == [Dimension("a", 2)]
    True
    """

    __slots__ = ()

    def __add__(self, other: Any) -> Dims:
        if isinstance(other, (tuple, list)):
            return Dims(tuple.__add__(self, tuple(other)))
        return NotImplemented

    def __radd__(self, other: Any) -> Dims:
        if isinstance(other, (tuple, list)):
            return Dims(tuple(other) + tuple(self))
        return NotImplemented

    @overload
    def __getitem__(self, key: SupportsIndex) -> Dimension: ...
    @overload
    def __getitem__(self, key: slice) -> Dims: ...
    def __getitem__(self, key: SupportsIndex | slice) -> Dimension | Dims:
        if isinstance(key, slice):
            return Dims(tuple.__getitem__(self, key))
        return tuple.__getitem__(self, key)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, list):
            return tuple(self) == tuple(other)
        return tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = tuple.__hash__


class IntList(list[int]):
    """A list of ints that returns itself when called, so that
    ``shape.to_integer_list`` (a property in Mesh TF) and
    ``shape.to_integer_list()`` both give the sizes."""

    __slots__ = ()

    def __call__(self) -> IntList:
        return self


@dataclass(frozen=True, init=False)
class Shape:
    """An ordered tuple of named dimensions with distinct names."""

    dims: Dims

    def __init__(self, dims: Iterable[DimensionLike] | str | Shape = ()) -> None:
        if isinstance(dims, Shape):
            converted: Dims = dims.dims
        elif isinstance(dims, str):
            converted = _parse_shape_string(dims)
        else:
            out = []
            for d in dims:
                cd = convert_to_dimension(d)
                if cd is None:
                    raise ShapeError("a shape cannot contain None")
                out.append(cd)
            converted = Dims(out)
        names = [d.name for d in converted]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ShapeError(
                f"shape [{', '.join(map(str, converted))}] repeats dimension "
                f"name(s) {dup}; names in one shape must be distinct"
            )
        object.__setattr__(self, "dims", converted)

    # -- sequence protocol -------------------------------------------------
    def __iter__(self) -> Iterator[Dimension]:
        return iter(self.dims)

    def __len__(self) -> int:
        return len(self.dims)

    @overload
    def __getitem__(self, key: int) -> Dimension: ...
    @overload
    def __getitem__(self, key: slice) -> Shape: ...
    def __getitem__(self, key: int | slice) -> Dimension | Shape:
        if isinstance(key, slice):
            return Shape(self.dims[key])
        return self.dims[key]

    def __contains__(self, item: object) -> bool:
        if isinstance(item, str):
            return item in self.dimension_names
        return item in self.dims

    def __add__(self, other: Any) -> Shape:
        return Shape(self.dims + convert_to_shape(other).dims)

    def __sub__(self, other: Any) -> Shape:
        """Removes the dims of ``other`` (names or dims) from this shape.

        As in Mesh TF, ``shape - None`` is the shape and ``shape - dim`` needs
        ``dim`` in the shape (``shape - [dim]`` is for a dim that may be
        absent); a bare name is one dim, a string with sizes a shape.
        """
        if other is None:
            return self
        if isinstance(other, str) and ":" in other:
            other = convert_to_shape(other)
        elif isinstance(other, (Dimension, str)):
            found = self.get_dim_by_name(dimension_name(other))
            if isinstance(other, Dimension) and other != found:
                raise ShapeError(
                    f"shape [{self}] has {found}, not {other}, to subtract"
                )
            other = [other]
        elif not isinstance(other, Iterable):
            raise ShapeTypeError(
                f"cannot subtract {other!r} from shape [{self}]; expected a "
                "dimension, a name, a list of them or a Shape"
            )
        names = {dimension_name(d) for d in other}
        return Shape([d for d in self.dims if d.name not in names])

    def __str__(self) -> str:
        return ",".join(str(d) for d in self.dims)

    def __repr__(self) -> str:
        return f"Shape('{self}')"

    # -- queries ------------------------------------------------------------
    @property
    def ndims(self) -> int:
        return len(self.dims)

    @property
    def dimension_names(self) -> list[str]:
        return [d.name for d in self.dims]

    @property
    def size(self) -> int:
        return math.prod(d.size for d in self.dims)

    @property
    def to_integer_list(self) -> IntList:
        """The sizes, in order: ``shape.to_integer_list`` (Mesh TF's property)
        or ``shape.to_integer_list()``."""
        return IntList(d.size for d in self.dims)

    def to_string(self) -> str:
        return str(self)

    def get_dim_by_name(self, name: str) -> Dimension:
        for d in self.dims:
            if d.name == name:
                return d
        raise ShapeError(f"shape [{self}] has no dimension named {name!r}")

    def has_dim_name(self, name: str) -> bool:
        return name in self.dimension_names

    def index(self, dim: Dimension | str) -> int:
        name = dimension_name(dim)
        try:
            return self.dimension_names.index(name)
        except ValueError:
            raise ShapeError(f"shape [{self}] has no dimension {name!r}") from None

    def resize_dimension(self, name: str, new_size: int) -> Shape:
        """This shape with dimension ``name`` resized to ``new_size``."""
        self.get_dim_by_name(name)  # a name the shape lacks is an error
        return Shape(
            [Dimension(name, new_size) if d.name == name else d for d in self.dims]
        )

    def rename_dimension(self, old_name: str, new_name: str) -> Shape:
        """This shape with dimension ``old_name`` renamed ``new_name``."""
        self.get_dim_by_name(old_name)
        return Shape(
            [
                Dimension(new_name, d.size) if d.name == old_name else d
                for d in self.dims
            ]
        )

    @property
    def cumprod(self) -> list[int]:
        """The exclusive cumulative products of the sizes, as Mesh TF's
        ``Shape.cumprod``: ``[1, s0, s0 * s1, ...]``, one per dim."""
        out, prefix = [], 1
        for d in self.dims:
            out.append(prefix)
            prefix *= d.size
        return out

    def cumprod_to_tensor_axis(self, cumprod: int) -> int | None:
        """The last tensor axis whose :attr:`cumprod` is ``cumprod``, or None
        (Mesh TF's)."""
        products = self.cumprod
        for i in range(len(products) - 1, -1, -1):
            if products[i] == cumprod:
                return i
        return None


def tight_colons(text: str) -> str:
    """``text`` without the blanks around its colons: ``"x : 2"`` is
    ``"x:2"`` in shape strings and layout rules alike."""
    return _COLON.sub(":", text)


def _parse_shape_string(text: str) -> Dims:
    text = tight_colons(text.strip())
    if not text:
        return Dims()
    # "." separates dims too (Mesh TF's), so "x:2.5" would read as "x:2"
    # and a dim "5" with no size: name the size instead.
    decimal = _DECIMAL_SIZE.search(text)
    if decimal is not None:
        raise ShapeError(
            f"dimension {decimal.group(0)!r} has size {decimal.group(1)!r}; "
            "expected an integer written in the digits 0-9"
        )
    parts = [p for p in _SEPARATORS.split(text) if p]
    dims = []
    for p in parts:
        d = convert_to_dimension(p)
        assert d is not None
        dims.append(d)
    return Dims(dims)


ShapeLike = Shape | str | Iterable[DimensionLike]


def convert_to_shape(x: Any) -> Shape:
    """Converts a Shape, a shape string or a list of dimension-likes to a Shape.

    >>> convert_to_shape([("batch", 4), "hidden:8"]).dimension_names
    ['batch', 'hidden']
    """
    if x is None:
        raise ShapeError("shape is None; expected a Shape, list of dims or 'a:2,b:3'")
    if isinstance(x, Shape):
        return x
    if isinstance(x, Dimension):
        return Shape([x])
    if isinstance(x, str) or isinstance(x, Iterable):
        return Shape(x)
    raise ShapeError(
        f"cannot convert {x!r} to a Shape; expected a Shape, a list of dimensions "
        "or a string such as 'a:10,b:5'"
    )


def convert_to_shape_or_none(x: Any) -> Shape | None:
    return None if x is None else convert_to_shape(x)


MeshShape = Shape
