"""The graph format's constants, size limits and field parsers.

Every parser takes the *path* of the field it reads (``operations[3].outputs[0]``)
so that a :class:`~mtf_core.errors.SerializationError` names the offending field:
the REST API returns these messages as 4xx bodies.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mtf_core import dtypes
from mtf_core.errors import MtfError, SerializationError
from mtf_core.shapes import Dimension, Shape

#: Value of the document's ``format`` field.
FORMAT_NAME = "mtf-graph"
#: Version this code writes.
FORMAT_VERSION = 1
#: Versions this code reads.
SUPPORTED_VERSIONS: tuple[int, ...] = (1,)


@dataclass(frozen=True)
class Limits:
    """Hard limits a reader enforces before building anything.

    The defaults are generous for programs written by hand; a service facing
    untrusted clients passes tighter ones.  ``None`` disables a limit.

    Attributes:
      max_operations: operations in the graph.
      max_rank: dimensions of one tensor.
      max_distinct_dims: distinct dimension names in the whole graph (the
        planner's problem grows with it).
      max_dim_size: size of one dimension.
      max_constant_elements: elements of one Constant's value.
      max_json_bytes: length of the text :func:`graph_from_json` parses.
    """

    max_operations: int | None = 100_000
    max_rank: int | None = 32
    max_distinct_dims: int | None = 10_000
    max_dim_size: int | None = 2**40
    max_constant_elements: int | None = 1_000_000
    max_json_bytes: int | None = 256 * 2**20

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise SerializationError(
                    f"Limits.{name} is {value!r}; expected a positive integer or None"
                )


DEFAULT_LIMITS = Limits()
NO_LIMITS = Limits(**{name: None for name in Limits.__dataclass_fields__})


def check_limit(limits: Limits, which: str, value: int, path: str, what: str) -> None:
    """Raises if ``value`` (the ``what`` of field ``path``) is over ``which``."""
    bound = getattr(limits, which)
    if bound is not None and value > bound:
        raise SerializationError(
            f"{path}: {what} {value} is over the limit {which}={bound}"
        )


def type_name(value: Any) -> str:
    """JSON's name for a value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, (list, tuple)):
        return "array"
    return type(value).__name__


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def expect_object(value: Any, path: str, keys: Sequence[str] = ()) -> Mapping[str, Any]:
    """``value`` as a JSON object that has ``keys``."""
    if not isinstance(value, Mapping):
        raise SerializationError(
            f"{path}: expected an object, got {type_name(value)} {_describe(value)}"
        )
    for key in keys:
        if key not in value:
            raise SerializationError(f"{path}: missing required field {key!r}")
    return value


def reject_unknown_keys(
    obj: Mapping[str, Any], path: str, allowed: Sequence[str]
) -> None:
    unknown = sorted(str(k) for k in obj if k not in allowed)
    if unknown:
        raise SerializationError(
            f"{path}: unknown field(s) {unknown}; expected only {sorted(allowed)}"
        )


def expect_list(value: Any, path: str) -> list[Any]:
    if not isinstance(value, (list, tuple)):
        raise SerializationError(
            f"{path}: expected an array, got {type_name(value)} {_describe(value)}"
        )
    return list(value)


def expect_str(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise SerializationError(
            f"{path}: expected a non-empty string, got {type_name(value)} "
            f"{_describe(value)}"
        )
    return value


def expect_int(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SerializationError(
            f"{path}: expected an integer, got {type_name(value)} {_describe(value)}"
        )
    return value


def expect_bool(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise SerializationError(
            f"{path}: expected true or false, got {type_name(value)} {_describe(value)}"
        )
    return value


#: How :func:`json_safe` writes non-finite floats, and what they read back as.
NON_FINITE = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def expect_number(value: Any, path: str) -> float:
    """A number, or one of the strings in :data:`NON_FINITE`."""
    if isinstance(value, str) and value in NON_FINITE:
        return NON_FINITE[value]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SerializationError(
            f"{path}: expected a number, got {type_name(value)} {_describe(value)}"
        )
    return float(value)


def parse_dtype(value: Any, path: str) -> str:
    name = expect_str(value, path)
    try:
        return dtypes.as_dtype_name(name)
    except MtfError:
        raise SerializationError(
            f"{path}: dtype {name!r} is not supported; expected one of "
            f"{sorted(dtypes.SIZES_BYTES)}"
        ) from None


def parse_shape(value: Any, path: str, limits: Limits) -> Shape:
    """A shape written as ``[{"name": "batch", "size": 8}, ...]``."""
    items = expect_list(value, path)
    check_limit(limits, "max_rank", len(items), path, "rank")
    dims: list[Dimension] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        where = f"{path}[{i}]"
        obj = expect_object(item, where, ("name", "size"))
        reject_unknown_keys(obj, where, ("name", "size"))
        name = expect_str(obj["name"], f"{where}.name")
        size = expect_int(obj["size"], f"{where}.size")
        if size < 1:
            raise SerializationError(
                f"{where}.size: dimension {name!r} has size {size}; expected a size "
                ">= 1"
            )
        check_limit(limits, "max_dim_size", size, f"{where}.size", "size")
        if name in seen:
            raise SerializationError(
                f"{where}.name: dimension name {name!r} appears twice in this shape "
                f"(also at index {seen[name]}); names in one shape must be distinct"
            )
        seen[name] = i
        try:
            dims.append(Dimension(name, size))
        except MtfError as e:
            raise SerializationError(f"{where}.name: {e}") from None
    return Shape(dims)


def shape_to_json(shape: Shape) -> list[dict[str, Any]]:
    return [{"name": d.name, "size": d.size} for d in shape]


def json_safe(value: Any, path: str) -> Any:
    """``value`` with tuples as lists and non-finite floats as the strings
    ``"Infinity"``, ``"-Infinity"``, ``"NaN"`` (JSON has no such numbers).

    Raises SerializationError for anything JSON cannot hold.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return (
            "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        )
    if isinstance(value, (list, tuple)):
        return [json_safe(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise SerializationError(
                    f"{path}: key {k!r} is not a string; JSON object keys must be"
                )
            out[k] = json_safe(v, f"{path}.{k}")
        return out
    # NumPy scalars and the like
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "shape", None) == ():
        return json_safe(item(), path)
    raise SerializationError(
        f"{path}: value {_describe(value)} of type {type(value).__name__} is not "
        "JSON-able; attrs() must return numbers, strings, booleans, null, lists "
        "and string-keyed objects"
    )
