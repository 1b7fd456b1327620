"""The CP-SAT layer: status mapping, the one-phase-at-a-time fallback, lazily
added memory rows, and the worker process."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from test_planner_graphs import PRESSURE_HW, PRESSURE_MESH, PRESSURE_SIZES, transformer

import mtf_core as mtf
from cost_models import get_hardware
from layout_planner import solver_process
from layout_planner.problem import LayoutProblem
from layout_planner.program import Objective, SolveParams, SolveStatus

pytestmark = pytest.mark.solver
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def test_every_cp_sat_status_maps_to_one_of_ours() -> None:
    from layout_planner.cpsat import _STATUS, cp_model

    names = {"OPTIMAL", "FEASIBLE", "INFEASIBLE", "MODEL_INVALID", "UNKNOWN"}
    assert {getattr(cp_model, n) for n in names} == set(_STATUS)
    assert {s.name for s in _STATUS.values()} == names == {s.name for s in SolveStatus}


def _small_program(objective: Objective):
    """The test Transformer's program (batch 16) on ``x:2;y:4`` of the CPU host."""
    model = transformer(batch=16)
    problem = LayoutProblem(
        model.graph,
        mtf.convert_to_shape("x:2;y:4"),
        get_hardware("cpu-host"),
        [model.loss],
    )
    return problem.program(objective, problem.hw.memory_bytes)


@pytest.mark.parametrize("objective", [Objective.TIME, Objective.MEMORY])
def test_phase_by_phase_fallback_ranks_like_the_single_objective(
    objective: Objective,
) -> None:
    program = _small_program(objective)
    one, _ = solver_process.solve(program, SolveParams(60, 2, 0, 4))
    # A tiny weight limit forces time, then each tie-break dim, to be solved
    # one after the other.
    split, _ = solver_process.solve(
        program, SolveParams(60, 2, 0, 4, max_objective_weight=50)
    )
    assert split.num_solves > one.num_solves
    assert [s.x for s in split.solutions] == [s.x for s in one.solutions]
    assert [s.time_ps for s in split.solutions] == [s.time_ps for s in one.solutions]
    assert all(s.status is SolveStatus.OPTIMAL for s in split.solutions)


@pytest.mark.parametrize("objective", [Objective.TIME, Objective.MEMORY])
def test_without_presolve_every_rank_is_the_same(
    objective: Objective, monkeypatch: pytest.MonkeyPatch
) -> None:
    from layout_planner import cpsat

    program = _small_program(objective)
    seen: list[bool] = []
    solve = cpsat.cp_model.CpSolver.solve

    def spy(self, model, *args, **kwargs):
        seen.append(self.parameters.cp_model_presolve)
        return solve(self, model, *args, **kwargs)

    monkeypatch.setattr(cpsat.cp_model.CpSolver, "solve", spy)
    with_it = cpsat.solve_program(program, SolveParams(60, 1, 0, 4))
    assert seen and all(seen)
    seen.clear()
    without = cpsat.solve_program(program, SolveParams(60, 1, 0, 4, presolve=False))
    assert seen and not any(seen)
    assert [s.x for s in without.solutions] == [s.x for s in with_it.solutions]
    assert [s.time_ps for s in without.solutions] == [
        s.time_ps for s in with_it.solutions
    ]
    assert [s.peak_bytes for s in without.solutions] == [
        s.peak_bytes for s in with_it.solutions
    ]
    assert all(s.status is SolveStatus.OPTIMAL for s in without.solutions)


@pytest.mark.parametrize("objective", [Objective.TIME, Objective.MEMORY])
def test_tie_break_solves_run_without_the_lp_to_the_same_answers(
    objective: Objective, monkeypatch: pytest.MonkeyPatch
) -> None:
    from layout_planner import cpsat

    program = _small_program(objective)
    # Time, then each tie-break dim, one after the other.
    params = SolveParams(60, 1, 0, 4, max_objective_weight=50)
    levels: list[tuple[str, int]] = []
    once = cpsat.SolveLoop._solve_once
    solve = cpsat.cp_model.CpSolver.solve

    def phase_spy(self, model, phase, *rest):  # type: ignore[no-untyped-def]
        levels.append((phase, -1))
        return once(self, model, phase, *rest)

    def solver_spy(self, model, *args, **kwargs):  # type: ignore[no-untyped-def]
        levels[-1] = (levels[-1][0], self.parameters.linearization_level)
        return solve(self, model, *args, **kwargs)

    monkeypatch.setattr(cpsat.SolveLoop, "_solve_once", phase_spy)
    monkeypatch.setattr(cpsat.cp_model.CpSolver, "solve", solver_spy)
    fast = cpsat.solve_program(program, params)
    tie_breaks = [level for phase, level in levels if phase.endswith(":tiebreak")]
    assert tie_breaks and set(tie_breaks) == {0}
    assert {level for phase, level in levels if not phase.endswith(":tiebreak")} == {
        cpsat.TUNING["linearization_level"]
    }
    monkeypatch.setattr(cpsat, "_TIEBREAK_LINEARIZATION", None)
    levels.clear()
    full = cpsat.solve_program(program, params)
    assert {level for _, level in levels} == {cpsat.TUNING["linearization_level"]}
    assert [s.x for s in fast.solutions] == [s.x for s in full.solutions]
    assert [s.time_ps for s in fast.solutions] == [s.time_ps for s in full.solutions]
    assert all(s.status is SolveStatus.OPTIMAL for s in fast.solutions)


@pytest.mark.parametrize("objective", [Objective.TIME, Objective.MEMORY])
def test_without_inprocessing_or_clique_merging_the_answers_are_cp_sats_defaults(
    objective: Objective, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The planner turns off the SAT solver's inprocessing and the merging of
    at-most-one constraints into cliques (cpsat.TUNING): every rank, phase by
    phase, comes out as under CP-SAT's defaults for both."""
    from ortools.sat import sat_parameters_pb2

    from layout_planner import cpsat

    program = _small_program(objective)
    params = SolveParams(60, 1, 0, 4, max_objective_weight=50)
    seen: list[tuple[bool, float]] = []
    solve = cpsat.cp_model.CpSolver.solve

    def spy(self, model, *args, **kwargs):  # type: ignore[no-untyped-def]
        prm = self.parameters
        seen.append((prm.use_sat_inprocessing, prm.merge_at_most_one_work_limit))
        return solve(self, model, *args, **kwargs)

    monkeypatch.setattr(cpsat.cp_model.CpSolver, "solve", spy)
    tuned = cpsat.solve_program(program, params)
    assert seen and set(seen) == {(False, 0.0)}
    defaults = sat_parameters_pb2.SatParameters()
    monkeypatch.setitem(
        cpsat.TUNING, "use_sat_inprocessing", defaults.use_sat_inprocessing
    )
    monkeypatch.setitem(
        cpsat.TUNING,
        "merge_at_most_one_work_limit",
        defaults.merge_at_most_one_work_limit,
    )
    seen.clear()
    plain = cpsat.solve_program(program, params)
    assert set(seen) == {(True, defaults.merge_at_most_one_work_limit)}
    assert len(tuned.solutions) == len(plain.solutions) == 4
    assert [s.x for s in tuned.solutions] == [s.x for s in plain.solutions]
    assert [s.time_ps for s in tuned.solutions] == [s.time_ps for s in plain.solutions]
    assert [s.peak_bytes for s in tuned.solutions] == [
        s.peak_bytes for s in plain.solutions
    ]
    assert all(s.status is SolveStatus.OPTIMAL for s in tuned.solutions)


def test_memory_rows_are_added_only_when_an_answer_breaks_them() -> None:
    model = transformer(**PRESSURE_SIZES)
    free = mtf.auto_layout(
        model.graph, PRESSURE_MESH, [model.loss], PRESSURE_HW, top_k=1, verify=False
    )
    assert free.solver.memory_rows_added == 0  # 80 GiB: no live set can bind
    limit = free.cost.peak_memory_bytes * 3 // 4
    plan = mtf.auto_layout(
        model.graph, PRESSURE_MESH, [model.loss], PRESSURE_HW, memory_limit=limit
    )
    rows = plan.solver.problem["num_memory_rows"]
    assert 0 < plan.solver.memory_rows_added < rows
    # ...yet the plan satisfies every live set: evaluate() agrees on its peak.
    assert plan.ok and plan.evaluation.peak_memory_bytes <= limit


def test_a_solve_again_after_rows_are_added_starts_from_the_old_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The answer that broke the new rows is a hint for the solve with them:
    # most often the new answer is near it (docs/scale.md, "Planning time").
    from layout_planner import cpsat

    calls: list[tuple[str, list[int] | None, list[int]]] = []
    once = cpsat.SolveLoop._solve_once

    def spy(self, model, phase, workers, hint, *rest):  # type: ignore[no-untyped-def]
        run = once(self, model, phase, workers, hint, *rest)
        calls.append((phase, None if hint is None else list(hint), run.values))
        return run

    monkeypatch.setattr(cpsat.SolveLoop, "_solve_once", spy)
    model = transformer(**PRESSURE_SIZES)
    free = mtf.auto_layout(
        model.graph, PRESSURE_MESH, [model.loss], PRESSURE_HW, top_k=1, verify=False
    )
    calls.clear()
    limit = free.cost.peak_memory_bytes * 3 // 4
    plan = mtf.auto_layout(
        model.graph, PRESSURE_MESH, [model.loss], PRESSURE_HW, memory_limit=limit
    )
    assert plan.solver.memory_rows_added > 0 and plan.ok
    again = [
        (prev, now)
        for prev, now in zip(calls, calls[1:])
        if now[0] == prev[0] and prev[2]
    ]
    assert again
    for (_, _, answer), (_, hint, _) in again:
        assert hint == answer


@pytest.mark.parametrize("hint", ["b:b;d_ff:m", "heads:b;d_model:m", "batch:b;heads:m"])
def test_a_layout_hint_changes_where_cp_sat_starts_not_the_answer(
    monkeypatch: pytest.MonkeyPatch, hint: str
) -> None:
    from layout_planner import cpsat
    from layout_planner.plan_mesh import plan_problem
    from mtf_core.layout import convert_to_layout_rules

    model = transformer(**PRESSURE_SIZES)
    mesh = mtf.convert_to_shape(PRESSURE_MESH)
    problem = LayoutProblem(model.graph, mesh, PRESSURE_HW, [model.loss])
    params = SolveParams(time_limit_s=60, num_workers=1, seed=0)
    plain = plan_problem(problem, Objective.TIME, params, verify=False, extras=False)
    hints: list[list[int] | None] = []
    once = cpsat.SolveLoop._solve_once

    def spy(self, model, phase, workers, given, *rest):  # type: ignore[no-untyped-def]
        hints.append(None if given is None else list(given))
        return once(self, model, phase, workers, given, *rest)

    monkeypatch.setattr(cpsat.SolveLoop, "_solve_once", spy)
    problem.hint = convert_to_layout_rules(hint)
    hinted = plan_problem(problem, Objective.TIME, params, verify=False, extras=False)
    assert hinted.layout_rules == plain.layout_rules
    assert hinted.cost == plain.cost
    # The first solve starts from the hint: each rule whose dim and axis
    # the problem has (a dim the graph lacks, such as "b", is left out).
    want = [0] * len(problem.x_index)
    for d, m in convert_to_layout_rules(hint):
        key = (d, mesh.dimension_names.index(m))
        if key in problem.x_index:
            want[problem.x_index[key]] = 1
    assert hints[0] == want and any(want)


def test_worker_process_solves_the_same_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MTF_PLANNER_SOLVER", "subprocess")
    model = transformer(batch=16)
    plan = mtf.auto_layout(model.graph, "x:2;y:2", [model.loss], top_k=3, verify=False)
    assert plan.solver.solved_in == "subprocess"
    monkeypatch.delenv("MTF_PLANNER_SOLVER")
    # In process, whether or not this test worker loaded TensorFlow first:
    # OR-tools is imported with RTLD_DEEPBIND (solver_process.cp_sat_import).
    assert solver_process.solver_location() == "inprocess"
    assert solver_process.how_loaded() == "deepbind"
    here = mtf.auto_layout(model.graph, "x:2;y:2", [model.loss], top_k=3, verify=False)
    assert here.solver.solved_in == "inprocess"
    assert [c.layout_rules for c in here.candidates] == [
        c.layout_rules for c in plan.candidates
    ]
    assert [c.cost for c in here.candidates] == [c.cost for c in plan.candidates]
    assert len(plan.candidates) == 3 and plan.status.value == "optimal"


def test_unknown_solver_location_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MTF_PLANNER_SOLVER", "gpu")
    with pytest.raises(mtf.MtfError, match="MTF_PLANNER_SOLVER='gpu'"):
        solver_process.solver_location()


def test_small_programs_get_one_worker_unless_the_caller_says() -> None:
    from dataclasses import replace

    from layout_planner.program import SMALL_PROGRAM_VARIABLES, workers_for

    model = transformer(batch=16)
    mesh = mtf.convert_to_shape("x:2;y:4")
    plan = mtf.auto_layout(model.graph, mesh, [model.loss], top_k=1, verify=False)
    assert plan.solver.num_workers == 1
    assert plan.solver.num_variables < SMALL_PROGRAM_VARIABLES
    two = mtf.auto_layout(
        model.graph, mesh, [model.loss], top_k=1, num_workers=2, verify=False
    )
    assert two.solver.num_workers == 2 and two.layout_rules == plan.layout_rules
    problem = LayoutProblem(model.graph, mesh, get_hardware("cpu-host"), [model.loss])
    program = problem.program(Objective.TIME, problem.hw.memory_bytes)
    assert workers_for(program, cores=16) == 1
    spec = program.dimsets[0]
    big = replace(
        program,
        dimsets=(replace(spec, choices=spec.choices * SMALL_PROGRAM_VARIABLES),),
    )
    assert workers_for(big, cores=16) == 8 and workers_for(big, cores=2) == 2


def test_the_plan_is_verified_beside_the_ranking_of_the_other_candidates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    from layout_planner import plan_mesh

    calls: list[str] = []
    real = plan_mesh._evaluate

    def spy(problem: LayoutProblem, rules: object) -> object:
        calls.append(threading.current_thread().name)
        return real(problem, rules)

    monkeypatch.setattr(plan_mesh, "_evaluate", spy)
    model = transformer(batch=16)
    plan = mtf.auto_layout(model.graph, "x:2;y:4", [model.loss], top_k=3)
    # evaluate() ran once, in its own thread, on the plan's layout.
    assert calls == ["plan-verify"]
    assert plan.solver.verified and plan.evaluation is not None
    again = mtf.auto_layout(model.graph, "x:2;y:4", [model.loss], top_k=1)
    assert calls[1:] == ["MainThread"]  # nothing to overlap with: in line
    assert again.evaluation == plan.evaluation


def test_an_error_in_the_early_verification_reaches_the_caller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from layout_planner import plan_mesh

    def broken(problem: LayoutProblem, rules: object) -> object:
        raise RuntimeError("evaluate broke")

    monkeypatch.setattr(plan_mesh, "_evaluate", broken)
    model = transformer(batch=16)
    with pytest.raises(RuntimeError, match="evaluate broke"):
        mtf.auto_layout(model.graph, "x:2;y:4", [model.loss], top_k=3)


def test_the_worker_pipe_carries_a_request_and_rejects_anything_else() -> None:
    import io

    from layout_planner.errors import SolverError

    model = transformer(batch=8)
    problem = LayoutProblem(
        model.graph, mtf.convert_to_shape("x:2"), get_hardware("cpu-host"), [model.loss]
    )
    program = problem.program(Objective.TIME, problem.hw.memory_bytes)
    params = SolveParams(10, 1, 0, 1)
    pipe = io.BytesIO()
    solver_process.write_message(pipe, (program, params))
    solver_process.write_message(pipe, ("a program", params))
    pipe.seek(0)
    got_program, got_params = solver_process.read_request(pipe)
    assert got_params == params
    assert got_program.x_labels == program.x_labels
    assert got_program.num_x == program.num_x > 0
    with pytest.raises(SolverError, match=r"sent a tuple; expected \(IntegerProgram"):
        solver_process.read_request(pipe)
    with pytest.raises(EOFError):
        solver_process.read_request(pipe)


def _satisfied(proto, values) -> bool:
    """Whether ``values`` meet every constraint of ``proto`` (a
    ``CpModelProto`` of linear, exactly-one and at-most-one constraints)."""

    def lit(v: int) -> int:
        return values[v] if v >= 0 else 1 - values[-v - 1]

    for c in proto.constraints:
        if not all(lit(e) for e in c.enforcement_literal):
            continue
        kind = c.WhichOneof("constraint")
        if kind == "linear":
            total = sum(values[v] * k for v, k in zip(c.linear.vars, c.linear.coeffs))
            d = list(c.linear.domain)
            if not any(d[i] <= total <= d[i + 1] for i in range(0, len(d), 2)):
                return False
        elif kind == "exactly_one":
            if sum(lit(v) for v in c.exactly_one.literals) != 1:
                return False
        elif kind == "at_most_one":
            if sum(lit(v) for v in c.at_most_one.literals) > 1:
                return False
        else:
            raise AssertionError(f"unchecked constraint kind {kind}")
    return True


def test_a_program_whose_presolved_form_cp_sat_rejects_is_solved_without_presolve(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A 2-layer LM on a 4-axis mesh: its time-and-tie-break objective fits
    # in 64 bits, but CP-SAT's presolve rewrites it into one that may
    # overflow and then calls the model invalid.
    from layout_planner import cpsat
    from mtf_core.models import TransformerConfig, build_lm

    model = build_lm(
        TransformerConfig(
            num_layers=2, d_model=256, heads=8, d_kv=32, d_ff=1024, vocab=8192,
            batch=32, length=128,
        )
    )  # fmt: skip
    problem = LayoutProblem(
        model.graph,
        mtf.convert_to_shape("x:64;y:4;z:4;w:4"),
        get_hardware("cpu-host"),
        [model.loss],
    )
    program = problem.program(Objective.TIME, problem.hw.memory_bytes)
    seen: list[tuple[bool, object, str]] = []
    solve = cpsat.cp_model.CpSolver.solve

    def spy(self, model, *args, **kwargs):
        code = solve(self, model, *args, **kwargs)
        seen.append((self.parameters.cp_model_presolve, code, model.validate()))
        return code

    monkeypatch.setattr(cpsat.cp_model.CpSolver, "solve", spy)
    got, _ = solver_process.solve(program, SolveParams(60, 1, 0, 1))
    # The valid model, rejected after presolve, then solved as it is.
    assert seen == [
        (True, cpsat.cp_model.MODEL_INVALID, ""),
        (False, cpsat.cp_model.OPTIMAL, ""),
    ]
    (best,) = got.solutions
    assert best.status is SolveStatus.OPTIMAL
    monkeypatch.undo()
    # Time and tie-break solved one after the other (no large objective):
    # the same layout and time.
    split, _ = solver_process.solve(
        program, SolveParams(60, 1, 0, 1, max_objective_weight=2**40)
    )
    assert split.num_solves == 2
    assert [s.x for s in split.solutions] == [best.x]
    assert [s.time_ps for s in split.solutions] == [best.time_ps]


def test_an_infeasible_answer_of_presolve_is_checked_without_it() -> None:
    # A tie-break program of the scale search of Llama-2-70B on 512 H100
    # (bench/scale.py), as the planner gave it to CP-SAT: the answer before
    # the tie-break satisfies it by construction, yet with the planner's
    # settings (probing off) CP-SAT's presolve calls it infeasible.
    from google.protobuf import text_format
    from ortools.sat import cp_model_pb2

    from layout_planner import cpsat

    text = gzip.open(FIXTURES / "cpsat_presolve_says_infeasible.pbtxt.gz", "rt").read()
    model = cpsat.cp_model.CpModel()
    model.proto.parse_text_format(text)
    proto = text_format.Parse(text, cp_model_pb2.CpModelProto())

    def solve(presolve: bool):
        solver = cpsat.tuned_solver(1, 0, presolve)
        return solver.solve(model), solver

    code, _ = solve(True)
    assert code == cpsat.cp_model.INFEASIBLE
    code, solver = solve(False)
    assert code == cpsat.cp_model.OPTIMAL
    assert _satisfied(proto, list(solver.response_proto.solution))
    # The planner's solve loop checks the infeasible answer without presolve.
    loop = cpsat.SolveLoop(None, SolveParams(30.0, 1, 0, 1))  # type: ignore[arg-type]
    run = loop._solve_once(model, "tiebreak", 1, None)
    assert run.status is SolveStatus.OPTIMAL
    assert _satisfied(proto, run.values)
