"""How to plan: :class:`PlanOptions`, the one value type for a plan request's
parameters (everything but the graph and the mesh).

``mtf.auto_layout``'s keyword arguments, the planner service's JSON body
(``api.schemas.PlanRequest``, converted in ``api.planning``), the service's
canonical request (``api.planning.PlanSpec``) and the task a solve worker
receives (``api.worker_main.solve_task``) all carry one of these, so a
parameter, its check and its default are written once, here.

>>> opts = PlanOptions(hardware="h100-nvlink-ib", top_k=3)
>>> opts.time_limit_s == DEFAULT_TIME_LIMIT_S, opts.objective.value
(True, 'time')
>>> PlanOptions.from_dict(opts.to_dict()) == opts
True
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from cost_models.hardware import PRESETS, HardwareProfile
from cost_models.profiles import get_hardware
from layout_planner.errors import PlannerError
from layout_planner.program import Objective, SolveParams
from mtf_core.shapes import ShapeLike

#: The solver's wall-clock budget when none is given, in the library, on the
#: wire and in the CLI alike.  The graphs we plan prove optimal in well under a
#: second (docs/benchmarks.md, "Planner"); the budget bounds the rare hard one.
DEFAULT_TIME_LIMIT_S = 10.0

#: Where to plan: a mesh shape (``"x:2;y:4"``, a Shape), or a device count,
#: and then the mesh shape is searched too.
MeshTarget = ShapeLike | int

#: CP-SAT's own bounds: at most 10000 workers, a 32-bit random seed.
MAX_WORKERS = 10_000
MAX_SEED = 2**31 - 1

#: The parameters a planner service chooses itself: a client's values for these
#: are not sent (``to_request_dict``) and not part of the cache key.
SERVER_CHOSEN = ("num_workers", "seed", "verify")


def _is_int(value: object) -> bool:
    """An integer (a numpy one too), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def memory_limit_bytes(value: object) -> int:
    """A memory limit given by a caller, in bytes per device: an integer, or
    a float with a whole value (``16e9``); a :class:`PlannerError` naming it
    otherwise."""
    whole: int
    if _is_int(value):
        whole = int(value)  # type: ignore[call-overload]  # numbers.Integral
    elif isinstance(value, float) and value.is_integer():
        whole = int(value)
    else:
        whole = 0
    if whole <= 0:
        raise PlannerError(
            f"memory_limit is {value!r}; expected a positive whole number of "
            "bytes per device"
        )
    return whole


@dataclass(frozen=True)
class PlanOptions:
    """The parameters of one plan request, checked and canonical.

    Attributes:
      hardware: the device profile (a preset name, a ``to_dict()`` mapping or a
        profile file path is accepted too, and resolved to a
        :class:`HardwareProfile` here).
      objective: ``Objective.TIME`` (compute + communication under the memory
        capacity) or ``Objective.MEMORY`` (peak bytes per device, then time);
        the strings ``"time"``/``"memory"`` are accepted.
      memory_limit_bytes: per-device bytes; overrides the hardware's capacity.
      top_k: how many distinct layouts to rank (the plan is rank 1).
      time_limit_s: the solver's wall-clock budget, per mesh shape tried.
      max_mesh_dims: with a device count instead of a mesh shape, the most mesh
        axes the search tries.
      num_workers: CP-SAT workers (``None``: chosen from the program's size).
      seed: CP-SAT's random seed.
      verify: price the plan again with ``cost_models.evaluate`` and raise if
        the two disagree.

    Bad values raise :class:`PlannerError` (a ``ValueError``) naming the field
    and the value.
    """

    hardware: HardwareProfile = PRESETS["cpu-host"]
    objective: Objective = Objective.TIME
    memory_limit_bytes: int | None = None
    top_k: int = 5
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    max_mesh_dims: int = 2
    num_workers: int | None = None
    seed: int = 0
    verify: bool = True

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # canonicalize a frozen instance
        set_(self, "hardware", get_hardware(self.hardware))
        set_(self, "objective", Objective.parse(self.objective))
        if self.memory_limit_bytes is not None:
            set_(
                self, "memory_limit_bytes", memory_limit_bytes(self.memory_limit_bytes)
            )
        if not _is_int(self.top_k) or self.top_k < 1:
            raise PlannerError(f"top_k is {self.top_k!r}; expected an integer >= 1")
        t = self.time_limit_s
        if (
            isinstance(t, bool)
            or not isinstance(t, numbers.Real)
            or not math.isfinite(t)
            or t <= 0
        ):
            raise PlannerError(f"time_limit_s is {t!r}; expected seconds > 0")
        set_(self, "time_limit_s", float(t))
        if not _is_int(self.max_mesh_dims) or self.max_mesh_dims < 1:
            raise PlannerError(
                f"max_mesh_dims is {self.max_mesh_dims!r}; expected an integer >= 1"
            )
        w = self.num_workers
        if w is not None and (not _is_int(w) or not 1 <= w <= MAX_WORKERS):
            raise PlannerError(
                f"num_workers is {w!r}; expected an integer >= 1 and <= {MAX_WORKERS}"
            )
        if not _is_int(self.seed) or not 0 <= self.seed <= MAX_SEED:
            raise PlannerError(
                f"seed is {self.seed!r}; expected an integer >= 0 and <= {MAX_SEED}"
            )
        if not isinstance(self.verify, bool):
            raise PlannerError(f"verify is {self.verify!r}; expected True or False")
        for f in (
            "memory_limit_bytes",
            "top_k",
            "max_mesh_dims",
            "num_workers",
            "seed",
        ):
            v = getattr(self, f)
            if v is not None:
                set_(self, f, int(v))  # a numpy integer as a plain one

    @property
    def hardware_with_limit(self) -> HardwareProfile:
        """The hardware, its memory capacity replaced by ``memory_limit_bytes``."""
        if self.memory_limit_bytes is None:
            return self.hardware
        return self.hardware.with_memory(self.memory_limit_bytes)

    def solve_params(self) -> SolveParams:
        """The CP-SAT settings (``num_workers=0``: chosen from the program)."""
        return SolveParams(
            self.time_limit_s, self.num_workers or 0, self.seed, self.top_k
        )

    def replace(self, **changes: Any) -> PlanOptions:
        """A copy with ``changes`` applied (and checked)."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise PlannerError(
                f"unknown plan option(s) {unknown}; expected some of {sorted(known)}"
            )
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data; :meth:`from_dict` gives back an equal value."""
        return {
            "hardware": self.hardware.to_dict(),
            "objective": self.objective.value,
            "memory_limit_bytes": self.memory_limit_bytes,
            "top_k": self.top_k,
            "time_limit_s": self.time_limit_s,
            "max_mesh_dims": self.max_mesh_dims,
            "num_workers": self.num_workers,
            "seed": self.seed,
            "verify": self.verify,
        }

    def to_request_dict(self) -> dict[str, Any]:
        """What a client sends a planner service: :meth:`to_dict` without the
        parameters the server chooses (:data:`SERVER_CHOSEN`), and a preset
        hardware profile by its name."""
        d = self.to_dict()
        for name in SERVER_CHOSEN:
            del d[name]
        if PRESETS.get(self.hardware.name) == self.hardware:
            d["hardware"] = self.hardware.name  # a preset goes by its name
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlanOptions:
        """Options from :meth:`to_dict`'s form; missing keys take the defaults,
        unknown keys are an error."""
        if not isinstance(data, Mapping):
            raise PlannerError(f"plan options {data!r} are not a mapping")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise PlannerError(
                f"unknown plan option(s) {unknown}; expected some of {sorted(known)}"
            )
        return cls(**data)


def resolve_options(
    hardware: str | HardwareProfile | Mapping[str, Any] = "cpu-host",
    objective: str | Objective = "time",
    memory_limit: int | None = None,
    top_k: int = 5,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    num_workers: int | None = None,
    seed: int = 0,
    verify: bool = True,
    max_mesh_dims: int = 2,
    options: PlanOptions | None = None,
) -> PlanOptions:
    """``auto_layout``'s parameters (everything after ``outputs``) as one
    :class:`PlanOptions`: ``options`` itself, or one made of the keywords.
    Giving both is an error, since one would silently lose."""
    keywords = PlanOptions(
        hardware=hardware,  # type: ignore[arg-type]  # resolved in __post_init__
        objective=objective,  # type: ignore[arg-type]
        memory_limit_bytes=memory_limit,
        top_k=top_k,
        time_limit_s=time_limit_s,
        max_mesh_dims=max_mesh_dims,
        num_workers=num_workers,
        seed=seed,
        verify=verify,
    )
    if options is None:
        return keywords
    if not isinstance(options, PlanOptions):
        raise PlannerError(f"options {options!r} is not a PlanOptions")
    if keywords != PlanOptions():
        raise PlannerError(
            "give the plan's parameters either as options=PlanOptions(...) or as "
            "keyword arguments, not both"
        )
    return options
