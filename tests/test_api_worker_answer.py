"""A solve worker answers a task before it collects the task's garbage."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

from api.worker_main import Report, answer
from layout_planner.errors import PlannerError


class _Node:
    """An object in a reference cycle: only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


class _Pipe:
    """The worker's end of the pipe: what was sent, whether the collector was
    on at each send, and how many of ``watched`` were still alive."""

    def __init__(self, broken: bool = False) -> None:
        self.sent: list[tuple[str, str, Any]] = []
        self.collecting: list[bool] = []
        self.alive: list[int] = []
        self.watched: list[weakref.ref[_Node]] = []
        self.broken = broken

    def send(self, message: tuple[str, str, Any]) -> None:
        if self.broken and message[0] != "progress":
            raise BrokenPipeError("the parent is gone")
        self.sent.append(message)
        self.collecting.append(gc.isenabled())
        self.alive.append(sum(r() is not None for r in self.watched))


@pytest.fixture(autouse=True)
def _collector_on() -> Any:
    was = gc.isenabled()
    gc.enable()
    gc.collect()
    yield
    if not was:  # pragma: no cover - pytest runs with the collector on
        gc.disable()


def test_the_reply_is_sent_before_the_tasks_garbage_is_collected() -> None:
    pipe = _Pipe()

    def solve(task: dict[str, Any], report: Report) -> dict[str, Any]:
        report("planning", 0.5)
        # A plan's graphs are left behind as cyclic garbage; so are these,
        # enough of them that an enabled collector would run meanwhile.
        pipe.watched = [weakref.ref(_Node()) for _ in range(5000)]
        return {"plan": task["x"] * 2}

    assert answer(pipe, "t1", {"x": 21}, solve)  # type: ignore[arg-type]
    assert pipe.sent == [
        ("progress", "t1", ("planning", 0.5)),
        ("result", "t1", {"plan": 42}),
    ]
    assert pipe.collecting == [False, False]
    assert pipe.alive == [0, 5000]  # not collected before the reply went
    assert gc.isenabled()
    gc.collect()
    assert not any(r() is not None for r in pipe.watched)


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (PlannerError("4 stages but 2 layers"), "invalid"),
        (ValueError("a bug"), "failed"),
    ],
)
def test_a_failed_task_is_answered_and_the_collector_restored(
    error: Exception, kind: str
) -> None:
    def solve(task: dict[str, Any], report: Report) -> dict[str, Any]:
        raise error

    pipe = _Pipe()
    assert answer(pipe, "t2", {}, solve)  # type: ignore[arg-type]
    ((sent_kind, task_id, text),) = pipe.sent
    assert (sent_kind, task_id) == (kind, "t2")
    assert str(error) in text
    assert gc.isenabled()


def test_a_gone_parent_stops_the_worker_with_the_collector_restored() -> None:
    pipe = _Pipe(broken=True)
    assert not answer(pipe, "t3", {}, lambda task, report: {})  # type: ignore[arg-type]
    assert gc.isenabled()
