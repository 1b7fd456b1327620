"""One CP-SAT model that chooses a program among several, and its layout.

The scale planner's recomputation options (keep everything, recompute the
attention scores, recompute whole blocks) are graphs of one model on one
mesh: one :class:`~layout_planner.program.IntegerProgram` each, over the
same dimension names.  :class:`ChoiceModel` puts them in one model, so one
solve returns the fastest (option, layout) pair that fits: compute is traded
for memory by the solver.  :mod:`layout_planner.recompute_program` builds
the programs and reads the answer.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from layout_planner import cp_proto
from layout_planner.cpsat import SolveLoop, Terms
from layout_planner.ortools_import import cp_sat_import
from layout_planner.program import (
    ChoiceProgram,
    ChoiceResult,
    Solution,
    SolveParams,
    SolveStatus,
)

with cp_sat_import():
    from ortools.sat.python import cp_model

__all__ = ["ChoiceModel", "solve_choice"]

# As in cpsat.LayoutModel: rows seeded per option, rows added per round.
_SEED_ROWS = 8
_ROWS_PER_ROUND = 8

XKey = tuple[str, int]  # (dim name, mesh axis index): one x variable


class ChoiceModel:
    """CP-SAT model of "which option, and which mesh axis splits each name".

    Options ``k = 0..K-1`` (each an :class:`IntegerProgram`, see
    :class:`~layout_planner.cpsat.LayoutModel`: dim sets ``S``, local
    assignments ``a``, time ``t_k[S,a]``, live sets ``L``, capacity
    ``cap_k``).  A dim set alike in several options (the same names, local
    assignments and invalid ones; the recomputation options share nearly
    all) is one group ``G`` with owners ``O(G)``; only its time, buffer and
    bytes differ between them.  Variables::

        r_k in {0,1}          option k is chosen;  sum_k r_k = 1
        x[d,m] in {0,1}       name d split over mesh axis m (one per (name,
                              axis) some option allows, shared by all)
        z[G,a] in {0,1}       group G takes assignment a
        B_k >= 0              option k's largest collective buffer
        T' >= 0               the chosen option's time above T_lo

    Constraints (``[r_k]``: enforced only when option k is chosen; ``[O]``:
    when one of the options O is, a literal equal to ``sum_{k in O} r_k``;
    a group no chosen option owns is free, and an option not chosen has its
    time and rows unread)::

        sum_m x[d,m] <= 1
        sum_a z[G,a] = 1,  z[G,a] = 0 if the owners' lowering rejects a
        x[d,m] = sum_{a: a(d)=m} z[G,a]             for d in G   [O(G)]
        x[d,m] + x[e,m] <= 1        d, e share a tensor in k     [r_k]
        x[d,b] <= sum_{e<d} x[e,a]  k's interchangeable axes a < b [r_k]
        x[d,m] <= sum_{k allows (d,m)} r_k    (a name only some options have)
        B_k >= sum_a buf_k[G,a] z[G,a]                    for G of k
        T' >= T0_k - T_lo + sum_{G of k, a} (t_k[G,a] - t0_k[G]) z[G,a]  [r_k]
        T' >= C - T_lo + sum_{G owned by all, a} min_k t_k[G,a] z[G,a]
        c_L + sum_{G of k, a} m_k[L,G,a] z[G,a] + B_k <= cap_k         [r_k]

    A constraint every option has is added once, unenforced.  ``t0_k[G]``:
    the least time of G's valid assignments in option k; ``T0_k``: option
    k's offset plus those; ``T_lo``: the least ``T0_k``; ``C``: the least,
    over options, of the offset plus ``t0_k`` of the groups not owned by
    all.  The second time row holds for every option, so it bounds ``T'``
    in the linear relaxation, where the enforced rows (big-M) hardly do
    while ``r`` is fractional.  Rows are added lazily, as in the single
    program: the chosen option's live sets are checked against each answer
    and the broken ones added.  An option is ruled out before the search
    (``r_k = 0``, none of its variables made) when a dim set has no valid
    assignment or a live set, split as far as any layout splits it, exceeds
    ``cap_k``.

    (Tried while building this, on the GPT-3-shaped stage of
    ``bench/recompute_program.py``: per-option z and x copies with ``sum_a
    z_k[S,a] = r_k`` (linear, the hull of the options' relaxations) took
    about twice as long as per-option z with enforced links, and that about
    three times as long as these shared groups with the time row above;
    adding the other options' rows broken under the chosen layout made
    more rounds, not fewer.)

    Objective: ``T'``, then the option's index (less recomputation first),
    then the single program's tie-break over x (names in name order, "not
    split" < first allowed axis < ...): ``T' W + k R + tiebreak`` when that
    fits in int64, else time, option and each tie-break chunk one after the
    other.  Within one option this is the single program's order, so the
    answer is the best of solving each option alone, ties to the earlier
    option.
    """

    def __init__(self, choice: ChoiceProgram, max_weight: int = 2**60) -> None:
        if not choice.options:
            raise ValueError("a ChoiceProgram needs at least one option")
        self.choice = choice
        self.programs = [o.program for o in choice.options]
        self.max_weight = max_weight
        self.model = cp_model.CpModel()
        self._exclude()
        self._create_variables()
        self._add_layout_constraints()
        self._add_memory_constraints()

    # -- phases ------------------------------------------------------------------
    def _exclude(self) -> None:
        """Options no layout can make fit (or none the lowering accepts)."""
        self._factors = [
            [np.asarray(f, dtype=np.int64) for _, f in p.tensor_classes]
            for p in self.programs
        ]
        self._class_host = [
            np.array([s for s, _ in p.tensor_classes], dtype=np.int64)
            for p in self.programs
        ]
        self.most_split: list[np.ndarray] = []
        excluded = []
        for k, p in enumerate(self.programs):
            split = np.zeros(0, dtype=np.int64)
            if p.num_rows:
                most = np.array([f.max() for f in self._factors[k]], dtype=np.int64)
                split = (p.row_bytes // most).sum(axis=1) + p.row_constants
            self.most_split.append(split)
            if any(all(ds.invalid) for ds in p.dimsets) or (
                len(split) and int(split.max()) > p.capacity_bytes
            ):
                excluded.append(k)
        self.excluded = tuple(excluded)
        self.live = [k for k in range(len(self.programs)) if k not in excluded]

    def _create_variables(self) -> None:
        m = self.model
        keys = sorted({key for o in self.choice.options for key in o.x_keys})
        self.x = {key: m.new_bool_var(f"{key[0]}@{key[1]}") for key in keys}
        axes: dict[str, list[int]] = {}
        for name, axis in keys:
            axes.setdefault(name, []).append(axis)
        self.dim_axes = sorted(axes.items())  # the tie-break's order
        self.r = {k: m.new_bool_var(f"r{k}") for k in self.live}
        # Dim sets that are the same in several options (the same names,
        # assignments and valid ones) share their z: one group each.
        self.z: dict[int, list[list[cp_model.IntVar]]] = {}
        self.groups: list[_Group] = []
        self.group_of: dict[tuple[int, int], int] = {}
        found: dict[tuple[object, ...], int] = {}
        self.buffer: dict[int, cp_model.IntVar | None] = {}
        for k in self.live:
            p = self.programs[k]
            names = self.choice.options[k].x_keys
            self.z[k] = []
            for s, ds in enumerate(p.dimsets):
                sig = (
                    tuple(
                        tuple(names[i] if i >= 0 else None for i in ch)
                        for ch in ds.choices
                    ),
                    ds.invalid,
                )
                g = found.get(sig)
                if g is None or k in self.groups[g].owners:
                    g = found[sig] = len(self.groups)
                    zs = [m.new_bool_var(f"z{g}_{a}") for a in range(len(ds.choices))]
                    self.groups.append(_Group(k, s, zs, []))
                self.groups[g].owners.append(k)
                self.group_of[(k, s)] = g
                self.z[k].append(self.groups[g].z)
            max_buf = max(
                (max(ds.buffer_bytes, default=0) for ds in p.dimsets), default=0
            )
            self.buffer[k] = m.new_int_var(0, max_buf, f"B{k}") if max_buf else None
        self.t_var: cp_model.IntVar | None = None
        self.time_floor_ps = 0

    def _xk(self, k: int, i: int) -> cp_model.IntVar:
        """Option k's x variable ``i`` (its program's index)."""
        return self.x[self.choice.options[k].x_keys[i]]

    def _add_layout_constraints(self) -> None:
        m = self.model
        if self.live:
            m.add_exactly_one(self.r.values())
        for name, axes in self.dim_axes:
            if len(axes) > 1:
                m.add_at_most_one(self.x[(name, a)] for a in axes)
        # Tensor conflicts (x[a] + x[b] <= 1) and symmetry precedences
        # (x[a] <= sum x[b...]), each with the options that have it.
        pairs: dict[tuple[XKey, XKey], list[int]] = {}
        precedes: dict[tuple[XKey, tuple[XKey, ...]], list[int]] = {}
        for k in self.live:
            keys = self.choice.options[k].x_keys
            for i, j in self.programs[k].conflicts:
                one, two = sorted((keys[i], keys[j]))
                pairs.setdefault((one, two), []).append(k)
            for i, js in self.programs[k].precedence:
                rule = (keys[i], tuple(sorted(keys[j] for j in js)))
                precedes.setdefault(rule, []).append(k)
        x = {key: var.index for key, var in self.x.items()}
        for (one, two), ks in pairs.items():
            for lit in self._enforced_by(ks):
                cp_proto.add_linear(m, [x[one], x[two]], [1, 1], hi=1, enforced_by=lit)
        for (low, highs), ks in precedes.items():
            indices = [x[low], *(x[h] for h in highs)]
            coefs = [1] + [-1] * len(highs)
            for lit in self._enforced_by(ks):  # x_low <= sum x_high
                cp_proto.add_linear(m, indices, coefs, hi=0, enforced_by=lit)
        have: dict[XKey, list[int]] = {}
        for k in self.live:
            for key in self.choice.options[k].x_keys:
                have.setdefault(key, []).append(k)
        for key, var in self.x.items():
            ks = have.get(key, [])
            if len(ks) < len(self.live):  # x <= sum of its options' r
                rs = [self.r[k].index for k in ks]
                cp_proto.add_linear(m, [var.index, *rs], [1] + [-1] * len(rs), hi=0)
        for group in self.groups:
            ds = self.programs[group.option].dimsets[group.dimset]
            dim_x = self.programs[group.option].dim_x
            zs = group.z
            m.add_exactly_one(zs)
            z = [v.index for v in zs]
            for a, bad in enumerate(ds.invalid):
                if bad:
                    cp_proto.add_linear(m, [z[a]], [1], 0, 0)
            lit = self._chosen_among(group.owners)
            for pos, d in enumerate(ds.dims):
                for xi in dim_x[d]:  # x = the z whose choice puts d there
                    on = [z[a] for a, ch in enumerate(ds.choices) if ch[pos] == xi]
                    xk = self._xk(group.option, xi).index
                    coefs = [1] + [-1] * len(on)
                    cp_proto.add_linear(m, [xk, *on], coefs, 0, 0, enforced_by=lit)
        for k in self.live:
            buffer = self.buffer[k]
            for s, ds in enumerate(self.programs[k].dimsets):
                if buffer is not None and any(ds.buffer_bytes):  # B_k >= its buffer
                    z = [v.index for v in self.z[k][s]]
                    coefs = [1, *(-b for b in ds.buffer_bytes)]
                    cp_proto.add_linear(m, [buffer.index, *z], coefs, lo=0)

    def _chosen_among(self, ks: Sequence[int]) -> int | None:
        """A literal (its variable's index) true when one of options ``ks``
        is chosen (None: all options are among them)."""
        if len(ks) == len(self.live):
            return None
        if len(ks) == 1:
            return self.r[ks[0]].index
        lit = self.model.new_bool_var("any_" + "_".join(map(str, ks)))
        self.model.add(lit == sum(self.r[k] for k in ks))
        return lit.index

    def _enforced_by(self, ks: Sequence[int]) -> list[int | None]:
        """The literals (variable indices) enforcing a constraint options
        ``ks`` have: none (one copy, unenforced) when every option has it,
        else one copy per option, enforced by its ``r_k``."""
        if len(ks) == len(self.live):
            return [None]
        return [self.r[k].index for k in ks]

    def _add_memory_constraints(self) -> None:
        """Per option, the live sets most likely to bind (as
        :class:`~layout_planner.cpsat.LayoutModel` seeds them under a
        capacity); :meth:`broken_rows` finds the others."""
        self.row_offset = np.cumsum([0, *(p.num_rows for p in self.programs)])
        self.row_added = np.zeros(int(self.row_offset[-1]), dtype=bool)
        seeds = []
        for k in self.live:
            p = self.programs[k]
            if not p.num_rows:
                continue
            largest = p.row_bytes.sum(axis=1) + p.row_constants
            largest = np.where(2 * self.most_split[k] > p.capacity_bytes, largest, -1)
            order = np.argsort(-largest, kind="stable")
            lo = int(self.row_offset[k])
            seeds += [lo + int(r) for r in order[:_SEED_ROWS] if largest[r] >= 0]
        self.add_rows(seeds)

    # -- lazily added rows (cpsat.LazyRows) ----------------------------------------
    def add_rows(
        self, rows: Sequence[int], clone: cp_model.CpModel | None = None
    ) -> None:
        """Adds live-set rows (numbered over every option's rows, option by
        option), each enforced by its option's ``r_k``, to the model (and to
        ``clone``, a clone of it)."""
        for g in rows:
            if self.row_added[g]:
                continue
            self.row_added[g] = True
            k = int(np.searchsorted(self.row_offset, g, side="right")) - 1
            terms = self._row_terms(k, g - int(self.row_offset[k]))
            for model in (self.model, clone) if clone is not None else (self.model,):
                capacity = self.programs[k].capacity_bytes
                terms.at_most(model, capacity, enforced_by=self.r[k].index)

    def _row_terms(self, k: int, r: int) -> Terms:
        p = self.programs[k]
        coefs: dict[int, np.ndarray] = {}
        for t, b in enumerate(p.row_bytes[r]):
            if b:
                s = int(self._class_host[k][t])
                add = int(b) // self._factors[k][t]
                coefs[s] = coefs[s] + add if s in coefs else add
        idx: list[int] = []
        cs: list[int] = []
        for s in sorted(coefs):
            for a, c in enumerate(coefs[s]):
                if c:
                    idx.append(self.z[k][s][a].index)
                    cs.append(int(c))
        buffer = self.buffer[k]
        if buffer is not None:
            idx.append(buffer.index)
            cs.append(1)
        return Terms(idx, cs, int(p.row_constants[r]))

    def chosen(self, values: Sequence[int]) -> int:
        """The option ``values`` chooses."""
        return next(k for k, r in self.r.items() if values[r.index])

    def _picks(self, k: int, values: Sequence[int]) -> list[int]:
        return [
            next(a for a, v in enumerate(zs) if values[v.index]) for zs in self.z[k]
        ]

    def broken_rows(self, values: Sequence[int]) -> list[int]:
        """The chosen option's rows not yet in the model that ``values``
        breaks (live set plus largest buffer over its capacity), worst
        first.  (Adding the other options' rows broken under the same
        layout too made the search slower: they are rarely the ones the
        next answer breaks.)"""
        k = self.chosen(values)
        return self._broken(k, self._picks(k, values))

    def _broken(self, k: int, picks: Sequence[int]) -> list[int]:
        p = self.programs[k]
        if not p.num_rows:
            return []
        host = self._class_host[k]
        factors = np.array(
            [f[picks[host[t]]] for t, f in enumerate(self._factors[k])],
            dtype=np.int64,
        )
        buffer = max(
            (ds.buffer_bytes[picks[s]] for s, ds in enumerate(p.dimsets)), default=0
        )
        need = (p.row_bytes // factors).sum(axis=1) + p.row_constants + buffer
        lo = int(self.row_offset[k])
        added = self.row_added[lo : lo + p.num_rows]
        over = np.flatnonzero((need > p.capacity_bytes) & ~added)
        over = over[np.argsort(-need[over], kind="stable")]
        return [lo + int(r) for r in over[:_ROWS_PER_ROUND]]

    # -- objective -----------------------------------------------------------------
    def time_variable(self) -> cp_model.IntVar:
        """``T'``, the chosen option's time above ``T_lo`` (integer
        picoseconds; :attr:`time_floor_ps` is ``T_lo``), made once."""
        if self.t_var is not None:
            return self.t_var
        floors: dict[int, int] = {}
        spreads: dict[int, int] = {}
        terms: dict[int, tuple[list[int], list[int]]] = {}
        for k in self.live:
            p = self.programs[k]
            floor, spread = p.time_offset_ps, 0
            idx: list[int] = []
            coefs: list[int] = []
            for s, ds in enumerate(p.dimsets):
                valid = [t for t, bad in zip(ds.time_ps, ds.invalid) if not bad]
                lo = min(valid, default=0)
                floor += lo
                spread += max(valid, default=0) - lo
                for a, (t, bad) in enumerate(zip(ds.time_ps, ds.invalid)):
                    if not bad and t != lo:
                        idx.append(self.z[k][s][a].index)
                        coefs.append(t - lo)
            floors[k], spreads[k], terms[k] = floor, spread, (idx, coefs)
        self.time_floor_ps = min(floors.values())
        self.time_spread = max(
            floors[k] - self.time_floor_ps + spreads[k] for k in self.live
        )
        m = self.model
        t_var = m.new_int_var(0, self.time_spread, "T_shifted")
        for k in self.live:
            idx, coefs = terms[k]
            above = Terms(idx, coefs, floors[k] - self.time_floor_ps)
            above.at_most_var(m, t_var.index, enforced_by=self.r[k].index)
        self._add_time_cut(t_var)
        self.t_var = t_var
        return t_var

    def _add_time_cut(self, t_var: cp_model.IntVar) -> None:
        """``T' >= C - T_lo + sum_{S shared by all, a} min_k t_k[S,a]
        z[S,a]`` (``C``: the least, over options, of the offset plus the
        least time of each dim set not shared by all), unenforced: every
        option's time is at least that, and without it the linear
        relaxation of the enforced time rows (big-M) bounds ``T'`` by
        little when ``r`` is fractional."""
        shared = {
            g
            for g, group in enumerate(self.groups)
            if len(group.owners) == len(self.live)
        }
        least: dict[int, tuple[list[int], tuple[bool, ...]]] = {}
        const: list[int] = []
        for k in self.live:
            p = self.programs[k]
            c = p.time_offset_ps
            for s, ds in enumerate(p.dimsets):
                g = self.group_of[(k, s)]
                if g not in shared:
                    c += min(t for t, bad in zip(ds.time_ps, ds.invalid) if not bad)
                    continue
                # (The groups' dim sets are alike in their valid assignments.)
                row, _ = least.setdefault(g, (list(ds.time_ps), ds.invalid))
                row[:] = [min(a, b) for a, b in zip(row, ds.time_ps)]
            const.append(c)
        offset = min(const) - self.time_floor_ps
        idx: list[int] = []
        coefs: list[int] = []
        for g, (row, invalid) in least.items():
            lo = min(t for t, bad in zip(row, invalid) if not bad)
            offset += lo
            for a, (t, bad) in enumerate(zip(row, invalid)):
                if not bad and t != lo:
                    idx.append(self.groups[g].z[a].index)
                    coefs.append(t - lo)
        Terms(idx, coefs, offset).at_most_var(self.model, t_var.index)

    def option_terms(self) -> Terms:
        """``sum_k (k - k0) r_k``: the chosen option's index, less the
        first option not ruled out."""
        first = self.live[0]
        ks = [k for k in self.live if k != first]
        return Terms([self.r[k].index for k in ks], [k - first for k in ks], 0)

    def tie_objectives(self) -> list[tuple[str, Terms]]:
        """What to minimise, in turn, once the time is fixed: ``k R +
        tiebreak`` when it fits in int64, else the option and then each
        tie-break chunk."""
        chunks = self.tiebreak_chunks()
        opt = self.option_terms()
        if len(chunks) == 1:
            weight = self.tiebreak_max(chunks[0]) + 1
            if weight * len(self.programs) < self.max_weight:
                tb = self.tiebreak_terms(chunks[0])
                return [
                    (
                        "choice:ties",
                        Terms(
                            [*opt.indices, *tb.indices],
                            [*(c * weight for c in opt.coefs), *tb.coefs],
                            0,
                        ),
                    )
                ]
        return [("choice:option", opt)] + [
            ("choice:tiebreak", self.tiebreak_terms(c)) for c in chunks
        ]

    def tiebreak_chunks(self) -> list[list[int]]:
        """Names (indices into :attr:`dim_axes`) grouped so each chunk's
        weights stay below ``max_weight``."""
        if not self.dim_axes:
            return []
        base = 1 + max(len(a) for _, a in self.dim_axes)
        per_chunk = 1
        while base ** (per_chunk + 1) < self.max_weight:
            per_chunk += 1
        dims = list(range(len(self.dim_axes)))
        return [dims[i : i + per_chunk] for i in range(0, len(dims), per_chunk)]

    def tiebreak_terms(self, dims: Sequence[int]) -> Terms:
        """``sum_d W_d code_d`` over ``dims``: ``code_d`` is 0 when name d is
        not split, else 1 + the axis's position among the axes any option
        allows it (mesh order); ``W_d`` powers of ``1 + max axes``."""
        base = 1 + max((len(self.dim_axes[d][1]) for d in dims), default=0)
        idx: list[int] = []
        coefs: list[int] = []
        for rank, d in enumerate(dims):
            name, axes = self.dim_axes[d]
            weight = base ** (len(dims) - 1 - rank)
            for pos, axis in enumerate(axes):
                idx.append(self.x[(name, axis)].index)
                coefs.append(weight * (pos + 1))
        return Terms(idx, coefs, 0)

    def tiebreak_max(self, dims: Sequence[int]) -> int:
        """The largest value :meth:`tiebreak_terms` can take."""
        base = 1 + max((len(self.dim_axes[d][1]) for d in dims), default=0)
        return sum(
            base ** (len(dims) - 1 - rank) * len(self.dim_axes[d][1])
            for rank, d in enumerate(dims)
        )

    def single_objective(self) -> Terms | None:
        """``T' W + k R + tiebreak`` as one objective, or None if it could
        overflow int64."""
        chunks = self.tiebreak_chunks()
        if len(chunks) > 1:
            return None
        dims = chunks[0] if chunks else []
        tb = self.tiebreak_terms(dims)
        option_weight = self.tiebreak_max(dims) + 1
        weight = option_weight * len(self.programs)
        t_var = self.time_variable()
        if (self.time_spread + 1) * weight >= self.max_weight:
            return None
        opt = self.option_terms()
        return Terms(
            [t_var.index, *opt.indices, *tb.indices],
            [weight, *(c * option_weight for c in opt.coefs), *tb.coefs],
            0,
            weight,
        )

    # -- reading an answer ---------------------------------------------------------
    def solution(
        self, values: Sequence[int], status: SolveStatus, bound: float
    ) -> tuple[int, Solution]:
        """The chosen option and its layout (x indexed as its program)."""
        k = self.chosen(values)
        p = self.programs[k]
        picks = self._picks(k, values)
        time_ps = p.time_offset_ps + sum(
            ds.time_ps[a] for ds, a in zip(p.dimsets, picks)
        )
        return k, Solution(
            x=tuple(bool(values[self._xk(k, i).index]) for i in range(p.num_x)),
            time_ps=time_ps,
            peak_bytes=None,
            status=status,
            best_bound=bound,
            objective=float(time_ps),
        )


@dataclass
class _Group:
    """A dim set shared by the options ``owners`` (first ``option``'s dim set
    ``dimset``) and its z variables."""

    option: int
    dimset: int
    z: list[cp_model.IntVar]
    owners: list[int]


def solve_choice(
    choice: ChoiceProgram, params: SolveParams, max_time_ps: int | None = None
) -> ChoiceResult:
    """The fastest (option, layout) of ``choice`` under each option's
    capacity; on equal time the earlier option, then the lexicographically
    smallest layout.  ``params.top_k`` is ignored (one answer).

    ``max_time_ps``: only an answer whose time is at most this is sought;
    where none is, the status is ``infeasible``.  The answer is the same
    wherever it is within the limit (the limit only cuts slower layouts),
    and CP-SAT proves that nothing fits within a limit below the optimum
    far sooner than it proves the optimum itself (a caller that needs only
    what beats a step found elsewhere passes that step)."""
    t0 = time.monotonic()
    cm = ChoiceModel(choice, params.max_objective_weight)
    if not cm.live:
        return _result(cm, SolveStatus.INFEASIBLE, None, t0, None)
    loop = SolveLoop(cm, params)
    workers = max(params.num_workers, 1)
    single = cm.single_objective()
    t_var = cm.time_variable()
    model = cm.model
    if max_time_ps is not None:
        if max_time_ps < cm.time_floor_ps:  # below every option's least time
            return _result(cm, SolveStatus.INFEASIBLE, None, t0, loop)
        model.add(t_var <= max_time_ps - cm.time_floor_ps)
    if single is not None:
        single.minimize(model)
        run = loop.solve(model, "choice", workers, None)
        if not run.status.has_solution:
            return _result(cm, run.status, None, t0, loop)
        bound = float(run.bound // single.weight + cm.time_floor_ps)
        return _result(
            cm, run.status, cm.solution(run.values, run.status, bound), t0, loop
        )
    # Time, then the option and the tie-break (together when they fit in
    # one objective, else the option and each chunk), each fixed in turn.
    model.minimize(t_var)
    run = loop.solve(model, "choice:time", workers, None)
    if not run.status.has_solution:
        return _result(cm, run.status, None, t0, loop)
    status, values = run.status, run.values
    bound = float(round(run.bound) + cm.time_floor_ps)
    model.add(t_var <= values[t_var.index])
    for name, terms in cm.tie_objectives():
        if terms.value(values) > 0:  # every term is >= 0: 0 is optimal
            terms.minimize(model)
            res = loop.solve(model, name, workers, values)
            if not res.status.has_solution:
                status = SolveStatus.FEASIBLE  # as fast, only less canonical
                break
            values = res.values
            if res.status is not SolveStatus.OPTIMAL:
                status = SolveStatus.FEASIBLE
        terms.at_most(model, terms.value(values))
    return _result(cm, status, cm.solution(values, status, bound), t0, loop)


def _result(
    cm: ChoiceModel,
    status: SolveStatus,
    answer: tuple[int, Solution] | None,
    t0: float,
    loop: SolveLoop | None,
) -> ChoiceResult:
    proto = cm.model.proto
    return ChoiceResult(
        status=status,
        option=answer[0] if answer is not None else None,
        solution=answer[1] if answer is not None else None,
        wall_time_s=time.monotonic() - t0,
        num_solves=loop.num_solves if loop is not None else 0,
        num_variables=len(proto.variables),
        num_constraints=len(proto.constraints),
        phases=tuple(loop.phases) if loop is not None else (),
        memory_rows_added=int(cm.row_added.sum()),
        excluded=cm.excluded,
    )
