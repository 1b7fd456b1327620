"""The integer program as plain, picklable data, and what its solver returns.

:mod:`layout_planner.problem` turns a graph into an :class:`IntegerProgram`;
:mod:`layout_planner.cpsat` builds and solves the CP-SAT model from it, in this
process or in a clean worker process (:mod:`layout_planner.solver_process`).
Nothing here imports OR-tools, so a process that loaded TensorFlow first can
build programs and read results without touching OR-tools at all.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

# Objective coefficients are integer picoseconds: CP-SAT needs integers, and a
# picosecond keeps even a one-op graph on a CPU host (tens of nanoseconds)
# exact to far below anything a cost model can claim.
PS_PER_S = 10**12
#: The time coefficients of a program (every assignment of every dim set,
#: plus the offset) must sum to less than this many picoseconds: CP-SAT
#: computes in int64 and refuses an objective whose terms could overflow it
#: (the sum of every coefficient, not of each set's largest).  The
#: reference models' programs sum to 2**58 (docs/scale.md).
MAX_PROGRAM_PS = 2**62


class SolveStatus(enum.Enum):
    """Our own solver status; every CP-SAT status maps to one of these."""

    OPTIMAL = "optimal"  # proven best (gap 0)
    FEASIBLE = "feasible"  # a layout, not proven best (time limit)
    INFEASIBLE = "infeasible"  # no layout satisfies the constraints (memory)
    MODEL_INVALID = "model_invalid"  # a bug: the program is malformed
    UNKNOWN = "unknown"  # time ran out before any layout was found

    @property
    def has_solution(self) -> bool:
        return self in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE)


class Objective(enum.Enum):
    """What the planner minimises."""

    TIME = "time"  # compute + communication, under the memory capacity
    MEMORY = "memory"  # peak bytes per device, then time

    @classmethod
    def parse(cls, value: object) -> Objective:
        if isinstance(value, Objective):
            return value
        for o in cls:
            if value == o.value:
                return o
        from layout_planner.errors import PlannerError

        raise PlannerError(
            f"objective {value!r} is unknown; expected one of {[o.value for o in cls]}"
        )


@dataclass(frozen=True)
class DimsetSpec:
    """One set of free dims with its local assignments (``z`` variables).

    ``dims`` are indices into :attr:`IntegerProgram.dim_x`.  ``choices[a][p]``
    is the x-variable index dim ``p`` takes in assignment ``a`` (-1: not
    split).  ``time_ps`` and ``buffer_bytes`` are per assignment: summed unit
    time and the largest collective result buffer.  ``invalid[a]`` marks
    assignments the lowering rejects.
    """

    dims: tuple[int, ...]
    choices: tuple[tuple[int, ...], ...]
    time_ps: tuple[int, ...]
    buffer_bytes: tuple[int, ...]
    invalid: tuple[bool, ...]


@dataclass(frozen=True, eq=False)
class IntegerProgram:
    """Everything CP-SAT needs, as integers (see :class:`cpsat.LayoutModel`).

    ``dim_x[d]`` lists dim ``d``'s x-variable indices, one per allowed mesh
    axis, in mesh order.  ``precedence`` pairs ``(i, js)`` mean ``x[i] <=
    sum x[js]``.

    Memory: ``row_bytes[r, t]`` is the unsplit bytes of live set ``r``'s
    tensors whose free dims are those of tensor class ``t``, and
    ``row_constants[r]`` the bytes no layout splits.  ``tensor_classes[t] =
    (s, f)``: class ``t`` is priced in dim set ``s``, and ``f[a]`` is how many
    pieces assignment ``a`` of ``s`` cuts such a tensor into.  So live set
    ``r`` needs ``row_constants[r] + sum_t row_bytes[r, t] // f_t[a_s]`` bytes
    per device.
    """

    num_x: int
    x_labels: tuple[str, ...]
    dim_x: tuple[tuple[int, ...], ...]
    conflicts: tuple[tuple[int, int], ...]
    dimsets: tuple[DimsetSpec, ...]
    tensor_classes: tuple[tuple[int, tuple[int, ...]], ...]
    row_bytes: np.ndarray  # int64 [rows, tensor classes]
    row_constants: np.ndarray  # int64 [rows]
    capacity_bytes: int
    objective: Objective
    time_offset_ps: int = 0
    precedence: tuple[tuple[int, tuple[int, ...]], ...] = ()
    #: A layout to try first (a value per x variable), or None: the first
    #: solve starts its search there.  It changes no answer, only how soon
    #: CP-SAT finds it.
    x_hint: tuple[bool, ...] | None = None

    def __post_init__(self) -> None:
        total = self.time_offset_ps + sum(sum(d.time_ps) for d in self.dimsets)
        if total >= MAX_PROGRAM_PS:
            from layout_planner.errors import PlannerError

            slowest = self.time_offset_ps + sum(
                max((t for t, bad in zip(d.time_ps, d.invalid) if not bad), default=0)
                for d in self.dimsets
            )
            raise PlannerError(
                f"a layout of this graph could take {slowest / PS_PER_S:,.0f} s, "
                f"and its integer program's time coefficients sum to {total:,} "
                f"ps; the planner's solver counts them in 64-bit integers, up to "
                f"2**{MAX_PROGRAM_PS.bit_length() - 1} ps; expected smaller dims, "
                "batch or micro-batch count, or faster hardware"
            )

    @property
    def num_rows(self) -> int:
        return int(self.row_bytes.shape[0])


@dataclass(frozen=True)
class SolveParams:
    """Solver settings: a wall-clock limit for the whole plan, workers, seed.

    ``num_workers=0`` lets :func:`workers_for` choose from the program's size.
    """

    time_limit_s: float = 60.0
    num_workers: int = 8
    seed: int = 0
    top_k: int = 1
    # Largest objective coefficient sum a single lexicographic objective may
    # reach (CP-SAT works in int64, and rejects a model whose terms could
    # overflow it); beyond it, phases are solved one by one.
    max_objective_weight: int = 2**62
    # CP-SAT's presolve.  The scale search's programs (a few hundred
    # variables, solved hundreds of times) solve in about half the time
    # without it, to the same optimum (bench/cpsat_presolve.py).
    presolve: bool = True


@dataclass(frozen=True)
class Solution:
    """One layout the solver found: the x values and its objective terms."""

    x: tuple[bool, ...]
    time_ps: int
    peak_bytes: int | None
    status: SolveStatus
    best_bound: float
    objective: float


@dataclass(frozen=True)
class ProgramResult:
    """What :func:`cpsat.solve_program` returns: ranked solutions and stats."""

    status: SolveStatus
    solutions: tuple[Solution, ...]
    wall_time_s: float
    num_solves: int
    num_variables: int
    num_constraints: int
    top_k_complete: bool
    phases: tuple[tuple[str, str, float], ...] = field(default=())
    memory_rows_added: int = 0


# A program with at most this many Boolean variables is proven optimal by one
# CP-SAT worker in milliseconds (the 4-axis Transformer has ~1,500); more
# workers then only share the cores and make each solve slower (three times,
# on two busy cores).  Bigger programs get CP-SAT's parallel portfolio.
SMALL_PROGRAM_VARIABLES = 5000


def workers_for(program: IntegerProgram, cores: int) -> int:
    """CP-SAT workers for ``program`` when the caller did not say: 1 for a
    small program, else ``cores`` (at most 8)."""
    variables = program.num_x + sum(len(ds.choices) for ds in program.dimsets)
    if variables <= SMALL_PROGRAM_VARIABLES:
        return 1
    return max(1, min(cores, 8))


@dataclass(frozen=True, eq=False)
class OptionProgram:
    """One option of a :class:`ChoiceProgram`: its own integer program (time
    objective, its own capacity) and, per x variable, the ``(dim name, mesh
    axis index)`` it stands for, which is how options share their x."""

    program: IntegerProgram
    x_keys: tuple[tuple[str, int], ...]


@dataclass(frozen=True, eq=False)
class ChoiceProgram:
    """Several programs on one mesh of which exactly one is chosen, together
    with its layout (:mod:`layout_planner.recompute_cpsat`).  On equal time
    the earlier option wins."""

    options: tuple[OptionProgram, ...]


@dataclass(frozen=True)
class ChoiceResult:
    """What :func:`layout_planner.recompute_cpsat.solve_choice` returns.

    ``option``: the chosen option's index (None without a solution);
    ``solution``: its layout, ``x`` indexed as that option's program;
    ``excluded``: the options ruled out before the search (a live set that
    cannot fit however its tensors are split, or a dim set with no valid
    assignment)."""

    status: SolveStatus
    option: int | None
    solution: Solution | None
    wall_time_s: float
    num_solves: int
    num_variables: int
    num_constraints: int
    phases: tuple[tuple[str, str, float], ...]
    memory_rows_added: int
    excluded: tuple[int, ...]
