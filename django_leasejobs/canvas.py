"""Workflows as values: steps, chains, groups and chords, and the graph they make.

Nothing here touches the database: :meth:`Canvas.enqueue` hands the whole canvas to the
backend of its first step (``LeaseJobsBackend.enqueue_workflow``), which writes the graph
in one transaction. ``django_leasejobs.workflows`` is the public face of this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from asgiref.sync import sync_to_async

from .compat import Task

if TYPE_CHECKING:
    from .workflow_results import WorkflowResult

ParentFailure = Literal["fail", "run"]
PARENT_FAILURE_MODES: tuple[ParentFailure, ...] = ("fail", "run")


class Canvas:
    """A part of a workflow: a :class:`Step`, :class:`Chain`, :class:`Group` or
    :class:`Chord`. Parts nest; :meth:`enqueue` writes the whole graph."""

    def steps(self) -> list[Step]:
        """Every step, in the order :meth:`graph` numbers them."""
        return [spec.step for spec in self.graph()]

    def graph(self) -> list[GraphStep]:
        """The steps with their parents (indexes into this list), in order."""
        out: list[GraphStep] = []
        self._place(out, ())
        if not out:
            raise ValueError("a workflow needs at least one step")
        return out

    def _place(self, out: list[GraphStep], parents: tuple[int, ...]) -> tuple[int, ...]:
        """Append this part's steps to ``out`` after ``parents``; return its last steps
        (what a part that follows it waits for)."""
        raise NotImplementedError

    def enqueue(self) -> WorkflowResult:
        """Write every step and the order between them in one transaction (the
        caller's, inside ``atomic()``). Steps waiting for a parent are not claimable
        until it succeeds."""
        graph = self.graph()
        first = graph[0].step.task
        backend = first.get_backend()
        enqueue_workflow = getattr(backend, "enqueue_workflow", None)
        if enqueue_workflow is None:
            raise TypeError(
                f"workflows need the LeaseJobs backend: {first.module_path} uses "
                f"{type(backend).__module__}.{type(backend).__qualname__} "
                f"(TASKS[{first.backend!r}])."
            )
        result: WorkflowResult = enqueue_workflow(graph)
        return result

    async def aenqueue(self) -> WorkflowResult:
        """:meth:`enqueue` from async code: the write runs off the event loop, in the
        thread Django gives the sync code of the current request (``thread_sensitive``,
        as the async ORM): inside sync code under ``atomic()`` that calls it through
        ``async_to_sync``, in that transaction; in an async view, committed on return."""
        return await sync_to_async(self.enqueue, thread_sensitive=True)()


@dataclass(frozen=True, slots=True)
class GraphStep:
    """One step of a flattened workflow and the steps it waits for (indexes)."""

    step: Step
    parents: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class Step(Canvas):
    """One task call, not enqueued yet."""

    task: Task
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    on_parent_failure: ParentFailure = "fail"

    def __post_init__(self) -> None:
        if not isinstance(self.task, Task):
            raise TypeError(
                f"step() takes a task (a function decorated with @task), not {self.task!r}."
            )
        if self.on_parent_failure not in PARENT_FAILURE_MODES:
            raise ValueError(
                f"on_parent_failure must be 'fail' (the default: the step fails without "
                f"running when a parent failed) or 'run' (it runs anyway), not "
                f"{self.on_parent_failure!r}."
            )

    @property
    def parent_failure_column(self) -> str | None:
        """``Job.on_parent_failure`` for this step: ``"run"``, or None for the default."""
        return "run" if self.on_parent_failure == "run" else None

    def _place(self, out: list[GraphStep], parents: tuple[int, ...]) -> tuple[int, ...]:
        out.append(GraphStep(self, parents))
        return (len(out) - 1,)


@dataclass(frozen=True, eq=False)
class Chain(Canvas):
    """Parts that run one after the other: each once the one before it succeeded."""

    parts: tuple[Canvas, ...]

    def _place(self, out: list[GraphStep], parents: tuple[int, ...]) -> tuple[int, ...]:
        for part in self.parts:
            parents = part._place(out, parents)
        return parents


@dataclass(frozen=True, eq=False)
class Group(Canvas):
    """Parts that run side by side (each after what the group waits for)."""

    parts: tuple[Canvas, ...]

    def _place(self, out: list[GraphStep], parents: tuple[int, ...]) -> tuple[int, ...]:
        if not self.parts:  # an empty group waits for nothing more: what follows it does not
            return parents
        ends: list[int] = []
        for part in self.parts:
            ends.extend(part._place(out, parents))
        return tuple(ends)


@dataclass(frozen=True, eq=False)
class Chord(Canvas):
    """A group, then a callback once every member succeeded."""

    header: Canvas
    callback: Canvas

    def _place(self, out: list[GraphStep], parents: tuple[int, ...]) -> tuple[int, ...]:
        return self.callback._place(out, self.header._place(out, parents))


def step(task: Task, *args: Any, on_parent_failure: ParentFailure = "fail", **kwargs: Any) -> Step:
    """A call of ``task`` (which may be ``task.using(...)``) as a workflow step.

    ``on_parent_failure="run"`` makes the step run even when a parent failed for good (a
    finaliser; it sees the failures as ``context.failed_parents``); by default it then
    ends ``failed`` without running.
    """
    return Step(task, tuple(args), dict(kwargs), on_parent_failure)


def _parts(parts: Sequence[Canvas], what: str) -> tuple[Canvas, ...]:
    for number, part in enumerate(parts):
        if not isinstance(part, Canvas):
            raise TypeError(
                f"{what}() part {number} is {part!r}: pass steps (step(task, ...) or "
                f"task.step(...)), chains, groups or chords."
            )
    return tuple(parts)


def chain(*parts: Canvas) -> Chain:
    """``parts`` one after the other."""
    return Chain(_parts(parts, "chain"))


def group(*parts: Canvas) -> Group:
    """``parts`` side by side."""
    return Group(_parts(parts, "group"))


def chord(header: Canvas, callback: Canvas) -> Chord:
    """``callback`` once every part of ``header`` (usually a :func:`group`) succeeded."""
    header, callback = _parts((header, callback), "chord")
    return Chord(header, callback)
