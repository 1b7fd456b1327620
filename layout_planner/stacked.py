"""A stage of ``n`` identical layers priced from graphs of 2, 3 and 4 layers.

A Transformer stage is ``n`` copies of one layer between an embedding and a
head.  Its planning problem is the same for every ``n`` except in two places,
both affine in ``n``, and :class:`StackedAnalysis` computes both from small
graphs instead of building the ``n``-layer one:

* the cost units: every unit class (equal signature and dims) of the ``n``
  layer graph appears ``c2 + (n - 2) (c3 - c2)`` times, ``ck`` its count in
  the ``k``-layer graph (checked against the 4-layer graph);
* the memory rows.  A live set at an op of layer ``j`` holds its own working
  set, what layers before ``j`` hold for their backward pass, what layers
  after it hold (gradients waiting for the optimizer) and every layer's
  weights: affine in ``j`` and ``n``.  A row of an inner layer is then a
  convex combination of the rows of the same op in the first and the last
  layer, and per-device bytes are linear in a row (each class's bytes are
  divisible by its split), so only the first and last layers' rows and the
  rows outside the layers matter, each ``r2 + (n - 2) (r3 - r2)`` for the
  same op in the 2- and 3-layer graphs.

Which op of the 3-layer graph is "the same op" as one of the 2-layer graph:
the op sequences (by signature) differ by one inserted layer per phase
(forward, backward, optimizer); an insertion may sit anywhere in its run of
repeated layers.  Every position ``p`` of an insertion for which the 2-, 3-
and 4-layer graphs' rows are affine (the 4-layer graph's insertion at the
same ``p``) pairs ops of equal role, and the rows of all those alignments
are kept (the extra ones are rows of inner layers: real, and never above
the maximum).  The tests compare the extrapolated tables and peaks with the
``n``-layer graph's, under many layouts.

Stages of another micro-batch size are the same graphs with a larger batch
dim (:meth:`LayerStack.resized`): when their 2- and 3-layer graphs repeat
the reference's op for op (which ops share a signature, which unit classes
there are and how many units each has), the alignment and the rows it keeps
carry over, and the 4-layer graph is not built again.  That is exact: every
tensor of one class has the same dim names, so the same number of elements,
and a class's bytes in a row are that number times the itemsizes of its
live tensors; a different batch size scales each column of every row by one
factor, so each check of affinity has the reference's answer.

The 3-layer graph need not be built again either (:meth:`LayerStack.resized`
without it): its rows are the reference's 3-layer rows, each column times
the factor that takes the reference's 2-layer column to the new one (the
ratio of the class's elements; checked to be one factor for the whole
column, and to give whole bytes), and its unit counts are the 2-layer
graph's plus the reference's steps.  What that takes on trust, as carrying
the 4-layer graph over already does: a 3-layer graph repeats the
reference's op for op when its 2-layer graph does (the builder makes its
layers alike at every batch size).  The winner's full stage graph is built
and checked.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cost_models.signatures import Signer
from cost_models.units import UnitClass
from layout_planner.analysis import MAX_GRAPH_BYTES, GraphAnalysis, unique_rows
from layout_planner.errors import PlannerError

#: Stages of at most this many layers are analysed as they are.  A 2-layer
#: stage is its own representative; a 3- or 4-layer stage is priced from its
#: stack like a deeper one, which costs less than building and analysing
#: its own graph (a resized stack needs its 2-layer graph alone, which the
#: meshes of that micro-batch size often have built already).
DIRECT_LAYERS = 2


class StackingError(PlannerError):
    """The small graphs do not extrapolate (their layers are not identical)."""


def per_op_rows(
    analysis: GraphAnalysis, classes: Sequence[tuple[str, ...]]
) -> np.ndarray:
    """Unsplit bytes per tensor class (columns in ``classes`` order) alive at
    each op of ``analysis``'s graph (rows in op order)."""
    memory = analysis.memory
    column = _columns(analysis, classes)
    n_ops = len(analysis.graph.operations)
    rows = np.zeros((n_ops + 1, len(classes)), dtype=np.int64)
    nbytes = np.asarray(memory.nbytes, dtype=np.int64)
    np.add.at(rows, (np.asarray(memory.start, dtype=np.int64), column), nbytes)
    np.subtract.at(rows, (np.asarray(memory.end, dtype=np.int64) + 1, column), nbytes)
    out: np.ndarray = np.cumsum(rows[:-1], axis=0)
    return out


def _columns(analysis: GraphAnalysis, classes: Sequence[tuple[str, ...]]) -> np.ndarray:
    """Each buffer's tensor class, as its index in ``classes``."""
    buffers = analysis.memory.buffers
    index = {c: i for i, c in enumerate(classes)}
    column: np.ndarray = np.fromiter(
        (index[tuple(sorted(t.shape.dimension_names))] for t in buffers),
        dtype=np.int64,
        count=len(buffers),
    )
    return column


def _op_keys(
    analyses: Sequence[GraphAnalysis],
) -> list[list[int]]:
    """Each graph's ops as small integers, equal where their signatures are
    (the analyses' own, signed here for ops outside the step)."""
    signer = Signer()
    ids: dict[object, int] = {}
    out = []
    for a in analyses:
        known = a.op_signatures
        out.append(
            [
                ids.setdefault(known.get(op) or signer.op(op), len(ids))
                for op in a.graph.operations
            ]
        )
    return out


@dataclass(frozen=True)
class _Insertion:
    lo: int  # first valid start in the 3-layer graph
    hi: int  # last valid start
    length: int  # ops of one layer in this phase


def _insertions(a: list[int], b: list[int]) -> list[_Insertion]:
    codes = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    if any(tag not in ("equal", "insert") for tag, *_ in codes):
        raise StackingError(
            "the 3-layer stage graph is not the 2-layer one with layers inserted"
        )
    out = []
    for tag, _, _, j1, j2 in codes:
        if tag != "insert":
            continue
        d = j2 - j1
        lo = hi = j1
        while lo > 0 and b[lo - 1] == b[lo - 1 + d]:
            lo -= 1
        while hi + d < len(b) and b[hi] == b[hi + d]:
            hi += 1
        out.append(_Insertion(lo, hi, d))
    return out


def _image(n_b: int, starts: Sequence[int], lengths: Sequence[int]) -> np.ndarray:
    keep = np.ones(n_b, dtype=bool)
    for p, d in zip(starts, lengths):
        keep[p : p + d] = False
    image: np.ndarray = np.nonzero(keep)[0]
    return image


class LayerStack:
    """What the 2-, 3- and 4-layer graphs of a stage say about every ``n``:
    each unit class's count and each kept memory row as ``base + (n - 2) *
    step`` (see the module docstring).  Raises :class:`StackingError` when
    the graphs do not stack."""

    def __init__(
        self, two: GraphAnalysis, three: GraphAnalysis, four: GraphAnalysis
    ) -> None:
        tensor_classes = list(two.tensor_classes)
        if {*three.tensor_classes, *four.tensor_classes} != set(tensor_classes):
            raise StackingError("the stage graphs' tensor classes differ")
        unit_steps = _unit_steps(two, three, four)
        k2, k3, k4 = _op_keys((two, three, four))
        r2, r3, r4 = (per_op_rows(a, tensor_classes) for a in (two, three, four))
        kept = _kept_rows(k2, k3, k4, r2, r3, r4)
        shapes = (_primitive(r2), _primitive(r3))
        bytes3 = _class_bytes(three, tensor_classes)
        self._made(two, unit_steps, kept, (k2, k3), r2, r3[kept[1]], bytes3, shapes)

    def _made(
        self,
        two: GraphAnalysis,
        unit_steps: list[int],
        kept: tuple[np.ndarray, np.ndarray],
        keys: tuple[list[int], list[int]],
        r2: np.ndarray,
        three_rows: np.ndarray,
        three_bytes: np.ndarray,
        shapes: tuple[np.ndarray, np.ndarray],
    ) -> None:
        """``three_rows``: the 3-layer graph's rows of the kept ops (``r3[i3]``
        for ``kept = (i2, i3)``); ``three_bytes``: its bytes per class."""
        self.two = two
        self.tensor_classes = list(two.tensor_classes)
        self.unit_steps = unit_steps
        #: What :meth:`resized` compares and carries over (and, without a
        #: 3-layer graph, scales: the 2-layer rows' column gcds, the 3-layer
        #: graph's kept rows and bytes).
        self._keys = keys
        self._kept = kept
        self._shapes = shapes  # _primitive(r2), _primitive(r3)
        self._counts = _class_counts(two)
        self._gcd2 = np.gcd.reduce(r2, axis=0)
        self._three_rows = three_rows
        self._three_bytes = three_bytes
        i2 = kept[0]
        base, step = r2[i2], three_rows - r2[i2]
        # Rows whose base and step are equal are one row for every n.
        pairs = unique_rows(np.concatenate([base, step], axis=1))
        width = len(self.tensor_classes)
        self.row_base, self.row_step = pairs[:, :width], pairs[:, width:]

    def resized(
        self, two: GraphAnalysis, three: GraphAnalysis | None = None
    ) -> LayerStack:
        """The stack of ``two`` and ``three``, the 2- and 3-layer graphs of
        this stack's stage at another micro-batch size, without their
        4-layer graph (see the module docstring).  Raises
        :class:`StackingError` when they do not repeat this stack's graphs
        op for op (build the 4-layer graph and stack them afresh).

        Without ``three``, the 3-layer graph is not built either: its rows
        are this stack's 3-layer rows with each column scaled by the factor
        that scales the column of ``two``'s rows (checked to be one factor,
        exactly), and its ops and unit counts are taken to repeat this
        stack's 3-layer graph as ``two`` repeats its 2-layer graph.  Raises
        :class:`StackingError` where that scaling is not exact in integers
        (build the 3-layer graph and pass it)."""
        if list(two.tensor_classes) != self.tensor_classes or (
            three is not None and set(three.tensor_classes) != set(self.tensor_classes)
        ):
            raise StackingError("the stage graphs' tensor classes differ")
        if _class_counts(two) != self._counts:
            raise StackingError("the 2-layer graph's cost-unit classes differ")
        keys = _op_keys((two,) if three is None else (two, three))
        if keys != list(self._keys[: len(keys)]):
            raise StackingError("the stage graphs' ops differ from the reference's")
        if three is not None:
            c3 = {_unit_key(c): c.count for c in three.unit_classes}
            if len(c3) != len(two.unit_classes) or any(
                c3.get(_unit_key(c)) != c.count + step
                for c, step in zip(two.unit_classes, self.unit_steps)
            ):
                raise StackingError("the 3-layer graph's cost-unit counts differ")
        r2 = per_op_rows(two, self.tensor_classes)
        if not np.array_equal(_primitive(r2), self._shapes[0]):
            raise StackingError(
                "the stage graphs' memory rows are not the reference's scaled"
            )
        if three is None:
            three_rows, three_bytes = self._scaled_three(r2)
        else:
            r3 = per_op_rows(three, self.tensor_classes)
            if not np.array_equal(_primitive(r3), self._shapes[1]):
                raise StackingError(
                    "the stage graphs' memory rows are not the reference's scaled"
                )
            three_rows = r3[self._kept[1]]
            three_bytes = _class_bytes(three, self.tensor_classes)
        out = LayerStack.__new__(LayerStack)
        out._made(
            two,
            list(self.unit_steps),
            self._kept,
            self._keys,
            r2,
            three_rows,
            three_bytes,
            self._shapes,
        )
        return out

    def _scaled_three(self, r2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The kept 3-layer rows and bytes per class of the stage whose
        2-layer rows are ``r2`` (each column the reference's times one
        factor, as :meth:`resized` checked): the reference's, each column
        times that factor ``a / b`` (in lowest terms)."""
        g = np.gcd.reduce(r2, axis=0)
        common = np.gcd(g, self._gcd2)
        empty = common == 0  # the column is all zero in both 2-layer graphs
        divisor = np.where(empty, 1, common)
        a, b = g // divisor, np.where(empty, 1, self._gcd2 // divisor)
        rows, nbytes = self._three_rows, self._three_bytes
        if (
            (rows[:, empty] != 0).any()
            or (nbytes[empty] != 0).any()
            or (rows % b != 0).any()
            or (nbytes % b != 0).any()
        ):
            raise StackingError(
                "the 3-layer graph's memory rows do not scale exactly; build it"
            )
        # In Python integers: under the analyses' bound, no row overflows.
        scaled = [int(n) // int(d) * int(m) for n, d, m in zip(nbytes, b, a)]
        if sum(scaled) >= MAX_GRAPH_BYTES:
            # Its analysis says what is too large.
            raise StackingError("the 3-layer graph may be too large; build it")
        out: np.ndarray = rows // b * a
        return out, np.asarray(scaled, dtype=np.int64)

    def analysis(self, n: int) -> StackedAnalysis:
        """The analysis of the ``n``-layer stage."""
        return StackedAnalysis(self, n)


class StackedAnalysis(GraphAnalysis):
    """A :class:`GraphAnalysis` of an ``n``-layer stage made from a
    :class:`LayerStack` (see the module docstring).

    ``graph`` (and the dim graph, memory model, outputs) are the 2-layer
    graph's; ``unit_classes`` carry the ``n``-layer counts and ``live_rows``
    the ``n``-layer rows, which is all :class:`LayoutProblem` prices.
    """

    def __init__(self, stack: LayerStack, n: int) -> None:
        if n < 2:
            raise StackingError(f"{n} layers; a stacked stage has at least 2")
        two = stack.two
        self.graph = two.graph
        self.outputs = two.outputs
        self.once_from = two.once_from
        self.dim_graph = two.dim_graph
        self.memory = two.memory
        self.op_signatures = two.op_signatures
        self.seconds = 0.0
        self.layers = n
        self.unit_classes = [
            UnitClass(c.unit, c.count + (n - 2) * step)
            for c, step in zip(two.unit_classes, stack.unit_steps)
        ]
        self.tensor_classes = list(stack.tensor_classes)
        rows = stack.row_base + (n - 2) * stack.row_step
        self.live_rows = unique_rows(rows)


def _class_counts(analysis: GraphAnalysis) -> list[tuple[frozenset[str], int]]:
    return [(c.unit.dim_names, c.count) for c in analysis.unit_classes]


def _class_bytes(
    analysis: GraphAnalysis, classes: Sequence[tuple[str, ...]]
) -> np.ndarray:
    """Unsplit bytes of all of ``analysis``'s buffers per tensor class
    (``classes`` order): what :class:`GraphAnalysis` bounds by
    :data:`~layout_planner.analysis.MAX_GRAPH_BYTES`."""
    out = np.zeros(len(classes), dtype=np.int64)
    nbytes = np.asarray(analysis.memory.nbytes, dtype=np.int64)
    np.add.at(out, _columns(analysis, classes), nbytes)
    return out


def _primitive(rows: np.ndarray) -> np.ndarray:
    """Each column of ``rows`` divided by the gcd of its entries: equal for
    two row sets (of non-negative bytes) exactly when each column of one is
    the other's times a positive rational (all-zero columns stay zero)."""
    g = np.gcd.reduce(rows, axis=0)
    out: np.ndarray = rows // np.where(g == 0, 1, g)
    return out


def _unit_key(c: UnitClass) -> tuple[object, ...]:
    return (c.unit.dim_names, c.unit.signature)


def _unit_steps(
    two: GraphAnalysis, three: GraphAnalysis, four: GraphAnalysis
) -> list[int]:
    """Per unit class of ``two``, how many more a layer adds."""
    c3 = {_unit_key(c): c.count for c in three.unit_classes}
    c4 = {_unit_key(c): c.count for c in four.unit_classes}
    if not (len(c3) == len(c4) == len(two.unit_classes)):
        raise StackingError("the stage graphs have different cost-unit classes")
    out = []
    for c in two.unit_classes:
        key = _unit_key(c)
        if key not in c3 or key not in c4:
            raise StackingError(f"cost unit {c.unit!r} is not in every stage graph")
        step = c3[key] - c.count
        if c4[key] - c3[key] != step:
            raise StackingError(
                f"cost unit {c.unit!r}: counts are not affine in layers"
            )
        out.append(step)
    return out


def _kept_rows(
    k2: list[int],
    k3: list[int],
    k4: list[int],
    r2: np.ndarray,
    r3: np.ndarray,
    r4: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The kept rows, as the ops of the 2-layer graph whose rows they are
    and the ops of the 3-layer graph that are the same ops (one pair a row;
    a row is ``r2[i2] + (n - 2) * (r3[i3] - r2[i2])``)."""
    ins3 = _insertions(k2, k3)
    ins4 = _insertions(k2, k4)
    if len(ins3) != len(ins4) or any(
        2 * i.length != j.length for i, j in zip(ins3, ins4)
    ):
        raise StackingError("the 4-layer stage graph does not repeat the 3-layer one")
    lengths3 = [i.length for i in ins3]
    lengths4 = [j.length for j in ins4]
    # Insertion k starts at p in the 3-layer graph and at p + (the layers
    # inserted before it) in the 4-layer graph.
    offset = np.concatenate([[0], np.cumsum(lengths3)[:-1]]).tolist()
    lows = [max(i.lo, j.lo - o) for i, j, o in zip(ins3, ins4, offset)]
    highs = [min(i.hi, j.hi - o) for i, j, o in zip(ins3, ins4, offset)]

    m3 = _image(len(k3), lows, lengths3)
    m4 = _image(len(k4), [p + o for p, o in zip(lows, offset)], lengths4)
    ok = np.all(r2 + 2 * (r3[m3] - r2) == r4[m4], axis=1)
    twos, threes = [np.nonzero(ok)[0]], [m3[ok]]
    covered = ok.copy()
    for k in range(len(ins3)):
        # Moving insertion k from lows[k] to p moves the ops of the 2-layer
        # graph that sat in [lows[k] + d, p + d) of the 3-layer graph one
        # layer earlier (two in the 4-layer graph); p is consistent when the
        # moved ops are affine moved and the others as they were.
        d, low, high = lengths3[k], lows[k], highs[k]
        window = np.nonzero((m3 >= low + d) & (m3 < high + d))[0]
        s3, s4 = m3[window] - d, m4[window] - lengths4[k]
        ok_moved = np.all(r2[window] + 2 * (r3[s3] - r2[window]) == r4[s4], axis=1)
        ok_kept = ok[window]
        moved_ok = np.concatenate([[True], np.cumprod(ok_moved).astype(bool)])
        kept_ok = np.concatenate([np.cumprod(ok_kept[::-1])[::-1].astype(bool), [True]])
        consistent = np.nonzero(moved_ok & kept_ok)[0]
        if len(consistent) == 0:
            raise StackingError(
                "the stage graphs' memory rows are not affine in layers (no "
                f"position of inserted layer {k} fits)"
            )
        top = int(consistent.max())
        moved = window[:top]
        twos.append(moved)
        threes.append(s3[:top])
        covered[moved] = True
    if not covered.all():
        raise StackingError("the stage graphs' memory rows are not affine in layers")
    return np.concatenate(twos), np.concatenate(threes)
