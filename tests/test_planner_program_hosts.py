"""The integer program's dim sets: each maximal table hosts the tables whose
dims it contains, through each host assignment's restriction to them."""

from __future__ import annotations

import pytest
from pricing_cases import HW, small_model

from layout_planner import problem as problem_module
from layout_planner.problem import LayoutProblem
from layout_planner.program import PS_PER_S, Objective
from mtf_core.shapes import convert_to_shape


@pytest.fixture(scope="module")
def model():
    return small_model()


def _problem(model, mesh: str) -> LayoutProblem:
    m, a = model
    return LayoutProblem(m.graph, convert_to_shape(mesh), HW, [m.loss], analysis=a)


@pytest.mark.parametrize("mesh", ["dp:2,tp:2", "x:2,y:2,z:2"])
def test_each_hosted_entry_is_the_hosts_assignment_restricted(model, mesh):
    problem = _problem(model, mesh)
    hosts = problem._hosts()
    hosted = sorted(t for h in hosts for t, _ in h.members)
    assert hosted == list(range(len(problem.tables)))  # each table once
    for h in hosts:
        host = problem.tables[h.table]
        for t, proj in h.members:
            table = problem.tables[t]
            assert set(table.dims) <= set(host.dims)
            for asg, k in zip(host.assignments, proj):
                want = tuple(asg[host.dims.index(d)] for d in table.dims)
                assert table.assignments[k] == want


def test_projections_looked_up_one_by_one_are_the_same(model, monkeypatch):
    problem = _problem(model, "x:2,y:2,z:2")
    fast = problem._hosts()
    monkeypatch.setattr(problem_module, "_MAX_CODE", 1)  # every table by lookups
    slow = problem._hosts()
    assert [h.table for h in fast] == [h.table for h in slow]
    for f, s in zip(fast, slow):
        assert [t for t, _ in f.members] == [t for t, _ in s.members]
        assert all((p == q).all() for (_, p), (_, q) in zip(f.members, s.members))


def test_a_dim_sets_choices_and_times_are_its_hosts_entries(model):
    problem = _problem(model, "dp:2,tp:2")
    program = problem.program(Objective.TIME, HW.memory_bytes)
    hosts = problem._hosts()
    assert len(program.dimsets) == len(hosts)
    for spec, h in zip(program.dimsets, hosts):
        host = problem.tables[h.table]
        for asg, choice in zip(host.assignments, spec.choices):
            assert choice == tuple(
                -1 if a is None else problem.x_index[(d, a)]
                for d, a in zip(host.dims, asg)
            )
        for a in range(len(host.assignments)):
            total = 0.0  # summed member by member, as the program sums them
            for t, proj in h.members:
                total += problem.tables[t].time_s[proj[a]]
            assert spec.time_ps[a] == int(round(total * PS_PER_S))
        assert all(type(v) is int for v in spec.time_ps + spec.buffer_bytes)
        assert all(type(v) is bool for v in spec.invalid)
