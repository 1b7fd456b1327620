"""Where a scale search's passes take each mesh's results from.

The passes (:func:`layout_planner.scale_search.search`) ask for a mesh's
free layout or joint program in a fixed order and stop where no remaining
bound can win.  A :class:`Source` answers them: :class:`InProcess` computes
each result when asked, and :class:`Ahead` computes results ahead on forked
processes (:class:`~layout_planner.scale_workers.Workers`) while the passes
wait for the one they need, leaving out what a known result has already
beaten.  Either way the passes see the same results in the same order, so
the trials and the plan do not depend on the number of processes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from cost_models.pipeline import (
    PipelineSpec,
)
from layout_planner.scale_plan import (
    ScaleChoice,
    ScaleTrial,
)
from layout_planner.scale_stages import Checked, Outcome, Stages
from layout_planner.scale_workers import WorkerError, Workers


@dataclass(frozen=True)
class Mesh:
    """One mesh of the search and its lower bound on the step."""

    bound_s: float
    stages: int
    tensor: int
    data: int
    micro_batches: int
    spec: PipelineSpec
    sequence: int = 1

    @property
    def sizes(self) -> tuple[int, int, int, int, int]:
        """(pp, dp, sp, tp, micro-batches): a trial's ``ScaleChoice.mesh_sizes``
        and micro-batch count."""
        return (self.stages, self.data, self.sequence, self.tensor, self.micro_batches)

    def __str__(self) -> str:
        sp = f" x sp {self.sequence}" if self.sequence > 1 else ""
        return f"pp {self.stages} x dp {self.data}{sp} x tp {self.tensor}"


def refined_first(trial: ScaleTrial) -> bool:
    """Whether the first pass's best ``trial`` gets its fewer micro-batches
    before the joint programs (whose bounds a faster step there prunes):
    where it has one stage, whose larger micro-batches lengthen no bubble,
    so that they are likely to be faster where they fit.  On more stages the
    round seldom wins before the joint programs (GPT-3's and Llama-2-70B on
    512 H100's did not, docs/scale.md), and it runs after them."""
    return trial.choice.stages == 1


@dataclass(frozen=True)
class FreeResult:
    """A mesh's first-pass result: its free trial (None without a least
    option) and lower bound, or why it could not be laid out."""

    outcome: Outcome | None
    bound_s: float
    error: str | None


@dataclass(frozen=True)
class Slower:
    """A joint program's answer under a step limit: no (option, layout) of
    its mesh that fits takes ``limit_s`` or less (``inf``: none fits at all,
    as ``message`` says)."""

    limit_s: float
    message: str


#: What a source runs: ("free", mesh) lays a mesh out free, ("joint", (mesh,
#: limit, bound)) runs its joint recomputation program for a step of at
#: most ``limit`` s (``bound``: its free layout's bound), on a process's
#: stages; ("check", (choice, rules)) prices a layout on its full stage
#: graph.
Result: TypeAlias = "FreeResult | Outcome | Slower | Checked | str"
Run = Callable[[Stages, tuple[str, Any]], Result]


class Source:
    """Where the passes of :func:`~layout_planner.scale_search.search` take
    each mesh's results from; a mesh is known by its index in :attr:`meshes`
    (the search's, then each one :meth:`add` brings)."""

    suffix = ""
    #: This process's own stages, where it lays meshes out itself (the
    #: winner's check reuses their graphs); None where only workers do.
    stages: Stages | None = None

    def __init__(self, meshes: Sequence[Mesh]) -> None:
        self.meshes = list(meshes)
        self._index = {m: i for i, m in enumerate(self.meshes)}

    def add(self, mesh: Mesh) -> int:
        """``mesh``'s index, added at the end if it is new."""
        i = self._index.get(mesh)
        if i is None:
            i = self._index[mesh] = len(self.meshes)
            self.meshes.append(mesh)
        return i

    def free(self, i: int) -> FreeResult:
        got = self._result(("free", i), math.inf, 0.0)
        assert isinstance(got, FreeResult)
        return got

    def joint(
        self, i: int, limit_s: float = math.inf, bound_s: float = 0.0
    ) -> Outcome | Slower | str:
        """Mesh ``i``'s joint program, found under a step limit of at least
        ``limit_s`` (a :class:`Slower` of a lower limit is never returned);
        ``bound_s``: a lower bound on its steps without recomputation (its
        free layout's)."""
        got = self._result(("joint", i), limit_s, bound_s)
        assert isinstance(got, (Outcome, Slower, str))
        return got

    def _item(
        self, task: tuple[str, Any], limit_s: float = math.inf, bound_s: float = 0.0
    ) -> tuple[str, Any]:
        """What runs for ``task``: a mesh's index becomes the mesh (and a
        joint program's, the mesh, its step limit and its bound)."""
        kind, what = task
        if kind == "check":
            return task
        if kind == "joint":
            return kind, (self.meshes[what], limit_s, bound_s)
        return kind, self.meshes[what]

    def _result(self, task: tuple[str, Any], limit_s: float, bound_s: float) -> Result:
        """``task``'s result (a joint program's under a step limit of at
        least ``limit_s``, ``bound_s`` its bound)."""
        raise NotImplementedError

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class InProcess(Source):
    """Each result computed when asked, in this process."""

    stages: Stages

    def __init__(self, meshes: Sequence[Mesh], run: Run, stages: Stages) -> None:
        super().__init__(meshes)
        self._run = run
        self.stages = stages

    def _result(self, task: tuple[str, Any], limit_s: float, bound_s: float) -> Result:
        return self._run(self.stages, self._item(task, limit_s, bound_s))


#: A fitting trial's step, its mesh's index, whether it was a free layout,
#: and the trial.
_Fit: TypeAlias = "tuple[float, int, bool, ScaleTrial]"


class Ahead(Source):
    """Results computed ahead on forked processes (:class:`Workers`), each
    with its own stages, while the passes wait for the one they need next.

    A worker that comes free gets, in turn: the task the passes wait for;
    the next free layout of a micro-batch size it already holds the graphs
    of, else of one no worker holds, else any; then, once every free layout
    is out, the joint program of the not-fitting mesh of lowest bound, its
    own sizes first among the next few.  A task that cannot beat the best
    fitting step known is left out: a free layout whose flops bound a
    mesh before it already reaches, a joint program whose bound any fitting
    trial reaches.  The passes would skip such a mesh too (the bounds are
    valid and sorted); should they ask for one anyway (two bounds equal to
    the last bit), it is computed then.  With nothing of that left
    (and given ``fewer``), an idle worker lays out free the meshes that
    ``fewer(choice, step)`` gives for the fastest fitting trial so far, which
    the search tries next (:func:`~layout_planner.scale_search._fewer_rounds`) unless a later result
    beats it; then (``check_ahead``) it prices that trial on its full stage
    graph, the winner's check if no later result beats it (:meth:`checked`)."""

    def __init__(
        self,
        meshes: Sequence[Mesh],
        run: Run,
        new_stages: Callable[[], Stages],
        workers: int,
        check_ahead: bool = False,
        incumbent_s: float = math.inf,
        joint_programs: bool = True,
        fewer: Callable[[ScaleChoice, float], list[Mesh]] | None = None,
        local: Stages | None = None,
        watch: bool = False,
    ) -> None:
        super().__init__(meshes)
        self._first = len(meshes)  # the first pass's meshes
        self._fewer = fewer
        self._incumbent_s = incumbent_s
        self._joint_programs = joint_programs
        self._run = run
        # ``local``: where this process lays meshes out too, beside
        # helpers started as fresh interpreters (``workers`` of them);
        # ``watch``: forked workers watched for a stall (UnsafeFork).
        self.stages = local
        here = local is not None
        count = min(workers, len(meshes) - here)
        self._pool = Workers(run, new_stages, count, fresh=here, watch=watch)
        processes = self._pool.count + here
        self.suffix = f" (on {processes} processes)"
        #: This process's index among the workers, where it is one.
        self._me = self._pool.count
        self._check_ahead = check_ahead
        self._done: dict[tuple[str, Any], Result] = {}
        self._sent: set[tuple[str, Any]] = set()
        #: The :attr:`Mesh.sizes` of the meshes each worker laid out.
        self._laid: dict[int, set[tuple[int, int, int, int, int]]] = {
            w: set() for w in range(processes)
        }
        #: Each fitting trial's (step, mesh, free layout?, trial).
        self._fits: list[_Fit] = []
        #: The meshes of fewer micro-batches of a first-pass free layout (or
        #: of one of these) that the passes try before the joint programs
        #: (:func:`refined_first`).
        self._early: set[int] = set()
        #: The fewest micro-batches of each round of them (:func:`~layout_planner.scale_search._fewer_rounds`
        #: goes on only from these).
        self._fewest: set[int] = set()

    def __exit__(self, *exc: object) -> None:
        self._pool.close()

    def _result(self, task: tuple[str, Any], limit_s: float, bound_s: float) -> Result:
        while True:
            while task not in self._done:
                if self.stages is not None and self._here(task, limit_s, bound_s):
                    continue
                self._feed(task, limit_s, bound_s)
                for key, got in self._pool.finished():
                    self._record(key, got)
                self._drop_beaten(task)
            got = self._done[task]
            if not (isinstance(got, Slower) and got.limit_s < limit_s):
                return got
            # Run ahead under a lower limit than the passes' (a fitting
            # trial they do not count yet): it says too little; run it again.
            del self._done[task]
            self._sent.discard(task)

    def _here(self, needed: tuple[str, Any], limit_s: float, bound_s: float) -> bool:
        """Where this process lays meshes out too: takes what the helpers
        finished, gives the idle ones work ahead, then runs ``needed`` here
        if no helper has it, else, while a helper runs it, what
        :meth:`_next` picks for this process (not a check, and not a joint
        program while fewer micro-batches are pending).  False if there is
        nothing to run here (then the caller waits for the helpers); True
        when ``needed`` may be done."""
        assert self.stages is not None
        for key, got in self._pool.finished(timeout=0.0):
            self._record(key, got)
        if needed in self._done:  # a helper's, just taken
            return True
        task: tuple[str, Any] | None = needed
        limit, bound = limit_s, bound_s
        if needed in self._sent:
            # Nothing stops a job once it runs here: no check ahead (the
            # winner may change), and no joint program ahead while fewer
            # micro-batches a helper lays out may still beat its bound.
            task = self._next(self._me)
            if task is None or task[0] == "check":
                return False
            if task[0] == "joint":
                if self._fewer_pending():
                    return False
                limit, bound = self._joint_limit(task[1])
        assert task is not None
        self._sent.add(task)
        if task[0] != "check":
            self._laid[self._me].add(self.meshes[task[1]].sizes)
        self._feed(needed, limit_s, bound_s)  # the helpers' work ahead
        self._record(task, self._run(self.stages, self._item(task, limit, bound)))
        return True

    def _fewer_pending(self) -> bool:
        """Whether a free layout of fewer micro-batches runs on a helper."""
        return any(
            ("free", i) in self._sent and ("free", i) not in self._done
            for i in range(self._first, len(self.meshes))
        )

    def _drop_beaten(self, needed: tuple[str, Any]) -> None:
        """Replaces each worker whose job a result since beats (the passes
        will skip it: a free layout that :meth:`_beaten_before` says so of,
        a joint program whose bound a fitting trial reaches), unless the
        passes wait for it: a fresh worker runs what they need sooner.  A
        helper started as a fresh interpreter is left to finish (starting
        another takes longer than most jobs)."""
        if self.stages is not None:
            return
        best = self._best_step()
        bounds = dict((i, b) for b, i in self._joint_bounds())
        for w, task in self._pool.running().items():
            assert isinstance(task, tuple)
            kind, i = task
            if task == needed or kind == "check" or i >= self._first:
                continue
            if (kind == "free" and self._beaten_before(i)) or (
                kind == "joint" and bounds[i] >= best
            ):
                self._pool.replace(w)
                self._sent.discard(task)
                self._laid[w] = set()

    def checked(self, choice: ScaleChoice, rules: str) -> Checked | None:
        """``rules`` of ``choice`` on its full stage graph, if a worker was
        given that or an idle worker laid out ``choice``'s mesh (it holds
        the graphs: a stage of up to 4 layers is its full graph), waiting
        for it to finish; else None."""
        task = ("check", (choice, rules))
        if task not in self._sent:
            mesh = (*choice.mesh_sizes, choice.micro_batches)
            holder = next((w for w in self._pool.idle() if mesh in self._laid[w]), None)
            if holder is None:
                return None
            self._sent.add(task)
            self._pool.submit(holder, task, task)
        while task not in self._done:
            for key, got in self._pool.finished():
                self._record(key, got)
        got = self._done[task]
        return got if isinstance(got, tuple) else None  # a str: it failed

    def _record(self, task: Hashable, got: Result) -> None:
        assert isinstance(task, tuple)
        self._done[task] = got
        outcome = got.outcome if isinstance(got, FreeResult) else got
        if isinstance(outcome, Outcome) and outcome.trial.fits:
            step = outcome.trial.step_time_s
            assert step is not None
            self._fits.append((step, task[1], task[0] == "free", outcome.trial))

    def _feed(self, needed: tuple[str, Any], limit_s: float, bound_s: float) -> None:
        """Gives each idle worker ``needed`` (a joint program's under the
        passes' ``limit_s``, with its ``bound_s``) or what :meth:`_next`
        picks."""
        for w in self._pool.idle():
            task = needed if needed not in self._sent else self._next(w)
            if task is None:
                break
            self._sent.add(task)
            if task[0] != "check":
                self._laid[w].add(self.meshes[task[1]].sizes)
            limit, bound = limit_s, bound_s
            if task != needed and task[0] == "joint":
                limit, bound = self._joint_limit(task[1])
            self._pool.submit(w, task, self._item(task, limit, bound))
        if not self._pool.busy() and needed not in self._sent:  # pragma: no cover
            raise WorkerError(f"nothing is running and {needed!r} is not done")

    def _next(self, w: int) -> tuple[str, Any] | None:
        meshes = self.meshes
        mine = self._micro_batches(w)
        held = set().union(*map(self._micro_batches, self._laid))
        frees = [
            i
            for i in range(self._first)
            if ("free", i) not in self._sent and not self._beaten_before(i)
        ]
        for pick in ("mine", "unheld", "any"):
            for i in frees:
                size = meshes[i].micro_batches
                if (
                    pick == "any"
                    or (pick == "mine" and size in mine)
                    or (pick == "unheld" and size not in held)
                ):
                    return ("free", i)
        if self._joint_programs:
            fastest = self._fastest([f for f in self._fits if self._is_early(f)])
            if fastest is not None and refined_first(fastest[3]):
                early = self._fewer_ahead(fastest)
                if early is not None:
                    return early
        best = self._best_step()
        joints = (
            [
                i
                for bound, i in sorted(self._joint_bounds())
                if ("joint", i) not in self._sent and bound < best
            ]
            if self._joint_programs
            else []
        )
        if not joints:
            return self._ahead_of_the_passes()
        near = joints[: self._pool.count]
        own = next((i for i in near if meshes[i].micro_batches in mine), near[0])
        return ("joint", own)

    def _joint_limit(self, i: int) -> tuple[float, float]:
        """The step limit for mesh ``i``'s joint program run ahead, and its
        bound: the fastest fitting step known that the passes will have
        seen when they ask for it (:meth:`_best_step`, and the joint
        programs before it in their order).  Should they count less by
        then, they ask again."""
        order = {i: (b, i) for b, i in self._joint_bounds()}
        before = [
            step
            for step, t, free, _ in self._fits
            if not free and t in order and order[t] < order[i]
        ]
        return min([self._best_step(), *before]), order[i][0]

    def _micro_batches(self, w: int) -> set[int]:
        """The micro-batch counts whose graphs worker ``w`` holds."""
        return {sizes[-1] for sizes in self._laid[w]}

    def _best_step(self) -> float:
        """The fastest fitting step known of the passes' meshes and of the
        fewer micro-batches they try before the joint programs (one laid
        out ahead for a trial that may not stay the best may bound a joint
        program the passes then need: it is computed when they ask), or the
        incumbent."""
        steps = [f[0] for f in self._fits if f[1] < self._first or self._is_early(f)]
        return min([*steps, self._incumbent_s])

    def _is_early(self, fit: _Fit) -> bool:
        _, i, free, _ = fit
        return (free and i < self._first) or i in self._early

    def _fastest(self, fits: Sequence[_Fit]) -> _Fit | None:
        """The fastest of ``fits`` that beats the incumbent (fewest stages,
        then sequence size, on a tie), if any."""
        return min(
            (f for f in fits if f[0] < self._incumbent_s),
            key=lambda f: (f[0], f[3].choice.stages, f[3].choice.sequence),
            default=None,
        )

    def _fewer_ahead(self, fastest: _Fit) -> tuple[str, Any] | None:
        """The next free layout not sent of the fewer micro-batches of the
        fitting trial ``fastest``, if the rounds go on from it."""
        if self._fewer is None:
            return None
        if fastest[1] >= self._first and fastest[1] not in self._fewest:
            return None  # its round's fewest did not win: the rounds end
        meshes = [self.add(mesh) for mesh in self._fewer(fastest[3].choice, fastest[0])]
        self._fewest.update(meshes[-1:])
        if self._is_early(fastest) and refined_first(fastest[3]):
            self._early.update(meshes)  # the passes try them before the joints
        return next(
            (("free", i) for i in meshes if ("free", i) not in self._sent), None
        )

    def _ahead_of_the_passes(self) -> tuple[str, Any] | None:
        """With nothing else to run, for the fastest fitting trial so far,
        which is the search's best unless a result still to come beats it:
        the free layouts of its fewer micro-batches, then the full stage
        graph's price of it."""
        fastest = self._fastest(self._fits)
        if fastest is None:
            return None
        free = self._fewer_ahead(fastest)
        if free is not None or not self._check_ahead:
            return free
        trial = fastest[3]
        check = ("check", (trial.choice, trial.layout_rules))
        return None if check in self._sent else check

    def _beaten_before(self, i: int) -> bool:
        bound = self.meshes[i].bound_s
        return bound >= self._incumbent_s or any(
            step <= bound and t < i and free for step, t, free, _ in self._fits
        )

    def _joint_bounds(self) -> list[tuple[float, int]]:
        """(bound, mesh) of each mesh the second pass may lay out, as far as
        known: laid out free, no error, and no fitting free layout."""
        out = []
        for (kind, i), got in self._done.items():
            if kind != "free" or i >= self._first:  # fewer micro-batches: free only
                continue
            assert isinstance(got, FreeResult)
            if got.error is not None:
                continue
            if got.outcome is not None and got.outcome.trial.fits:
                continue
            out.append((max(got.bound_s, self.meshes[i].bound_s), i))
        return out
