"""The producer API from async code: ``await task.aenqueue(...)``, ``await
backend.aget_result(id)``, ``await result.arefresh()``, and for workflows ``await
canvas.aenqueue()``, ``await aget_workflow(id)``, ``await workflow.arefresh()``.

Each runs its sync twin with ``sync_to_async(thread_sensitive=True)``, as Django's async
ORM runs a query (docs/concepts.md, "From async code"). Shown here:

* from real ASGI requests: an async view (``tests/urls_async_producer.py``) served by
  Django's ``AsyncClient``, and by Django's ``ASGIHandler`` driven as a server drives it,
  stores the jobs and the workflow with their arguments, reads them back and refreshes
  them, and sends no statement from the event loop's thread;
* the event loop keeps running while a call waits for the database: another connection
  holds a lock on the table the call needs, and a ticker coroutine ticks while the
  call's statement is in flight;
* transactions: called through ``async_to_sync`` inside ``atomic()``, a call is part of
  that transaction; in an async view, where none is open, it has committed on return;
* bad input raises what the sync call raises, and stores nothing.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from asgiref.sync import async_to_sync
from django.core.handlers.asgi import ASGIHandler
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created
from django.db.models import Model
from django.test import AsyncClient

from django_leasejobs.backend import LeaseJobsBackend
from django_leasejobs.compat import (
    InvalidTask,
    TaskResult,
    TaskResultDoesNotExist,
    task_backends,
)
from django_leasejobs.exceptions import InvalidTaskArguments, UnknownTask, WorkflowDoesNotExist
from django_leasejobs.lease_task import LeaseTask
from django_leasejobs.models import Job, Workflow
from django_leasejobs.workflows import (
    Chain,
    WorkflowResult,
    aget_workflow,
    chain,
    get_workflow,
    step,
)
from tests.tasks import add
from tests.waiting import wait_until

COMMITTED = pytest.mark.django_db(transaction=True)
ASYNC_VIEWS = pytest.mark.urls("tests.urls_async_producer")

TICKS = 5
"""Ticks of the event loop to count while a call's statement is in flight: a call that
held the loop lets it count none."""
TICK = 0.01
LOCK_SAFETY = 15.0
"""Seconds after which a table lock lets go by itself, so that a call that held the event
loop ends and the test fails instead of hanging (below SQLite's 20 s busy timeout)."""

T = TypeVar("T")


def backend() -> LeaseJobsBackend:
    found = task_backends["default"]
    assert isinstance(found, LeaseJobsBackend)
    return found


# --------------------------------------------------------------------------- instruments


@dataclass
class Sent:
    """One statement: the thread that sent it, and whether it returned."""

    thread: int
    sql: str
    returned: threading.Event = field(default_factory=threading.Event)


class StatementWatch:
    """Every statement sent through Django's cursors to the default database while the
    watch is on, on any thread's connection: the connections open when it starts and those
    opened meanwhile (``connection_created``). Each connection is listed with the thread
    that opened it."""

    def __init__(self) -> None:
        self.sent: list[Sent] = []
        self.connections: list[tuple[int, BaseDatabaseWrapper]] = []

    def __enter__(self) -> StatementWatch:
        connection_created.connect(self._created, weak=False)
        self._watch(connections[DEFAULT_DB_ALIAS])
        return self

    def __exit__(self, *exc_info: object) -> None:
        connection_created.disconnect(self._created)
        for _, watched in self.connections:
            watched.execute_wrappers.remove(self._record)

    def threads(self) -> set[int]:
        return {sent.thread for sent in self.sent}

    def in_flight(self) -> bool:
        """A statement was sent and has not returned."""
        return any(not sent.returned.is_set() for sent in self.sent)

    def _created(self, sender: object, connection: BaseDatabaseWrapper, **kwargs: object) -> None:
        if connection.alias == DEFAULT_DB_ALIAS:
            self._watch(connection)

    def _watch(self, watched: BaseDatabaseWrapper) -> None:
        if self._record not in watched.execute_wrappers:
            watched.execute_wrappers.append(self._record)
            self.connections.append((threading.get_ident(), watched))

    def _record(
        self,
        execute: Callable[..., Any],
        sql: str,
        params: Any,
        many: bool,
        context: dict[str, Any],
    ) -> Any:
        sent = Sent(threading.get_ident(), sql)
        self.sent.append(sent)
        try:
            return execute(sql, params, many, context)
        finally:
            sent.returned.set()


class TableLock:
    """Another connection, in a thread of its own, locks ``model``'s table until
    :meth:`release`, or for ``LOCK_SAFETY`` seconds at most (``timed_out`` then).

    PostgreSQL ``LOCK TABLE ... IN ACCESS EXCLUSIVE MODE`` and MySQL/MariaDB ``LOCK
    TABLES ... WRITE`` make reads and writes of the table wait; on SQLite a write
    transaction holds the database's write lock, which makes writes wait (readers never
    wait for a writer in WAL mode, which the tests' settings use).
    """

    def __init__(self, model: type[Model]) -> None:
        self.table = model._meta.db_table
        self.timed_out = threading.Event()
        self._held = threading.Event()
        self._release = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._hold, name=f"lock {self.table}")

    def __enter__(self) -> TableLock:
        self._thread.start()
        wait_until(
            lambda: self._held.is_set() or self._error is not None,
            what=f"another connection's lock on {self.table}",
        )
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()
        self._thread.join(timeout=LOCK_SAFETY + 10)
        assert not self._thread.is_alive(), f"the lock on {self.table} was not let go"

    def release(self) -> None:
        self._release.set()

    def _hold(self) -> None:
        own = connections[DEFAULT_DB_ALIAS]  # this thread's connection, opened here
        try:
            with self._locked(own):
                self._held.set()
                if not self._release.wait(LOCK_SAFETY):
                    self.timed_out.set()
        except BaseException as exc:  # told to the test by __enter__
            self._error = exc
        finally:
            own.close()

    @contextmanager
    def _locked(self, own: BaseDatabaseWrapper) -> Iterator[None]:
        table = own.ops.quote_name(self.table)
        if own.vendor == "mysql":  # LOCK TABLES commits an open transaction: autocommit
            with own.cursor() as cursor:
                cursor.execute(f"LOCK TABLES {table} WRITE")
                try:
                    yield
                finally:
                    cursor.execute("UNLOCK TABLES")
            return
        with transaction.atomic(using=own.alias), own.cursor() as cursor:
            if own.vendor == "postgresql":
                cursor.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            else:  # SQLite: a write statement takes the write lock until the commit
                cursor.execute(f"UPDATE {table} SET id = id WHERE 1 = 0")
            yield


async def _ticking_while_in_flight(
    call: Callable[[], Awaitable[T]], watch: StatementWatch, lock: TableLock
) -> T:
    """Run ``call`` while ``lock`` keeps its statement waiting; require the event loop to
    tick ``TICKS`` times while the statement is in flight, then let go of the lock."""
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(TICK)  # the beat counted, not a wait for a state
            if watch.in_flight():
                ticks += 1

    def ticked() -> bool:
        if lock.timed_out.is_set():
            raise AssertionError(
                f"the lock let go by itself after {LOCK_SAFETY}s; the event loop ticked "
                f"{ticks} times while the call's statement was in flight (it held the loop)"
            )
        return ticks >= TICKS

    beat = asyncio.create_task(ticker())
    pending = asyncio.ensure_future(call())
    try:
        await asyncio.to_thread(
            wait_until,
            ticked,
            timeout=LOCK_SAFETY,
            what=lambda: f"{TICKS} ticks while the statement waited (got {ticks})",
        )
        assert not pending.done(), "the call ended while the lock was held"
    finally:
        lock.release()
        beat.cancel()
    return await pending


# --------------------------------------------------------------------------- ASGI requests


@pytest.mark.django_db
@ASYNC_VIEWS
def test_an_async_view_served_through_asgi_enqueues_reads_and_refreshes() -> None:
    """Django's AsyncClient (its ASGI request and handler, in the test's transaction: the
    sync code runs in the thread that called ``async_to_sync``, this one)."""
    with StatementWatch() as watch:
        response = async_to_sync(AsyncClient().get)("/enqueue/", {"a": 2, "b": 3})
    assert response.status_code == 200, response.content
    body = response.json()

    job = Job.objects.get(pk=int(body["enqueued"]["id"]))
    assert (job.task_path, job.args, job.kwargs) == ("tests.tasks.add", [2, 3], {})
    ready = {"id": body["enqueued"]["id"], "status": "READY", "args": [2, 3]}
    assert body["enqueued"] == body["through_task"] == body["before"]["job"] == ready
    assert body["after"] == {
        "job": {**ready, "status": "SUCCESSFUL"},
        "return_value": 5,
        "workflow": "SUCCESSFUL",
    }

    workflow = Workflow.objects.get(pk=int(body["workflow"]))
    steps = [Job.objects.get(pk=int(s["id"])) for s in body["steps"]]
    assert [(s.workflow_id, s.args) for s in steps] == [
        (workflow.pk, [2, 3]),
        (workflow.pk, [3, 2]),
    ]
    assert body["found_steps"] == [s["id"] for s in body["steps"]]
    assert body["before"]["workflow"] == "READY"

    # Every statement of the request ran in the thread for sync code, none on the loop.
    assert watch.sent
    assert body["loop_thread"] not in watch.threads()


async def _asgi_get(app: ASGIHandler, path: str, query: str) -> tuple[int, bytes]:
    """One GET request through ``app`` as an ASGI server sends it; the status and body."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", b"testserver")],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    answered = asyncio.Event()
    asked = False
    messages: list[Mapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await answered.wait()  # the client stays connected until the answer
        return {"type": "http.disconnect"}

    async def send(message: Mapping[str, Any]) -> None:
        messages.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            answered.set()

    await app(scope, receive, send)
    status = next(m["status"] for m in messages if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return status, body


@COMMITTED
@ASYNC_VIEWS
def test_under_the_asgi_handler_each_call_commits_in_the_requests_own_thread() -> None:
    """As under uvicorn or daphne: the loop in a thread of its own (here the test's), and
    each request's sync code in a thread of the request (Django's ThreadSensitiveContext),
    with its own connection, in autocommit, closed when the request ends."""
    with StatementWatch() as watch:
        status, content = asyncio.run(_asgi_get(ASGIHandler(), "/enqueue/", "a=4&b=5"))
    assert status == 200, content
    body = json.loads(content)

    # Committed: this thread's connection (another one) sees the rows.
    assert Job.objects.get(pk=int(body["enqueued"]["id"])).args == [4, 5]
    assert Workflow.objects.get(pk=int(body["workflow"])).step_count == 2
    assert body["after"]["workflow"] == "SUCCESSFUL"

    assert body["loop_thread"] == threading.get_ident()
    assert len(watch.threads()) == 1 and body["loop_thread"] not in watch.threads()
    opened = [c for thread, c in watch.connections if thread in watch.threads()]
    assert opened and all(c.connection is None for c in opened), "the request left it open"


# --------------------------------------------------------------------------- the event loop


@dataclass(frozen=True)
class Stored:
    """A job and a workflow committed before the lock is taken (for the reads)."""

    job: TaskResult
    workflow: WorkflowResult


@dataclass(frozen=True)
class LockedCall:
    """A call of the async API, the table whose lock keeps it waiting, whether it only
    reads (SQLite in WAL mode never makes a reader wait), and the arguments of the jobs
    it returns."""

    model: type[Model]
    reads: bool
    call: Callable[[Stored], Awaitable[TaskResult | WorkflowResult]]
    args: list[list[int]]


async def _refreshed_job(stored: Stored) -> TaskResult:
    await stored.job.arefresh()
    return stored.job


async def _refreshed_workflow(stored: Stored) -> WorkflowResult:
    await stored.workflow.arefresh()
    return stored.workflow


LOCKED_CALLS = {
    "task.aenqueue": LockedCall(Job, False, lambda _: add.aenqueue(7, 8), [[7, 8]]),
    "backend.aget_result": LockedCall(
        Job, True, lambda s: backend().aget_result(s.job.id), [[1, 2]]
    ),
    "task.aget_result": LockedCall(Job, True, lambda s: add.aget_result(s.job.id), [[1, 2]]),
    "result.arefresh": LockedCall(Job, True, _refreshed_job, [[1, 2]]),
    "canvas.aenqueue": LockedCall(
        Workflow,
        False,
        lambda _: chain(step(add, 7, 8), step(add, 8, 7)).aenqueue(),
        [[7, 8], [8, 7]],
    ),
    "aget_workflow": LockedCall(
        Workflow, True, lambda s: aget_workflow(s.workflow.id), [[1, 2], [2, 1]]
    ),
    "backend.aget_workflow": LockedCall(
        Workflow, True, lambda s: backend().aget_workflow(s.workflow.id), [[1, 2], [2, 1]]
    ),
    "workflow.arefresh": LockedCall(Workflow, True, _refreshed_workflow, [[1, 2], [2, 1]]),
}


def _jobs_of(outcome: TaskResult | WorkflowResult) -> list[TaskResult]:
    return outcome.steps if isinstance(outcome, WorkflowResult) else [outcome]


@COMMITTED
@pytest.mark.parametrize("name", LOCKED_CALLS)
def test_the_event_loop_runs_while_a_call_waits_for_the_database(name: str) -> None:
    """Fails when the call runs its queries on the event loop: the loop then cannot tick
    until the lock lets go by itself (checked by making ``aenqueue`` call ``enqueue``
    directly, with ``DJANGO_ALLOW_ASYNC_UNSAFE`` set so that Django does not refuse it)."""
    case = LOCKED_CALLS[name]
    if case.reads and connection.vendor == "sqlite":
        pytest.skip("SQLite in WAL mode never makes a reader wait for a lock: no wait to watch")
    stored = Stored(add.enqueue(1, 2), chain(step(add, 1, 2), step(add, 2, 1)).enqueue())

    with TableLock(case.model) as lock, StatementWatch() as watch:
        outcome = async_to_sync(_ticking_while_in_flight)(lambda: case.call(stored), watch, lock)

    assert not lock.timed_out.is_set()
    jobs = _jobs_of(outcome)
    assert [result.args for result in jobs] == case.args
    assert [Job.objects.get(pk=int(result.id)).args for result in jobs] == case.args


# --------------------------------------------------------------------------- transactions


def _seen_by_another_connection(job_id: str) -> bool:
    """Whether a connection of another thread sees the job (committed)."""
    seen: list[bool] = []

    def look() -> None:
        try:
            seen.append(Job.objects.filter(pk=int(job_id)).exists())
        finally:
            connections[DEFAULT_DB_ALIAS].close()

    looker = threading.Thread(target=look)
    looker.start()
    looker.join()
    assert len(seen) == 1
    return seen[0]


class _RolledBack(Exception):
    pass


@COMMITTED
def test_through_async_to_sync_inside_atomic_the_calls_are_part_of_the_transaction() -> None:
    """What a helper written as a coroutine does when sync code inside ``atomic()`` runs it
    with ``async_to_sync`` (in an async view: sync code run with ``sync_to_async``). With a
    thread pool instead (``thread_sensitive=False``) the enqueue would commit on another
    connection at once (SQLite: wait for the write lock this transaction holds)."""
    with pytest.raises(_RolledBack), transaction.atomic():
        job = async_to_sync(add.aenqueue)(1, 2)
        flow = async_to_sync(chain(step(add, 3, 4), step(add, 4, 3)).aenqueue)()
        assert async_to_sync(backend().aget_result)(job.id).args == [1, 2]
        assert len(async_to_sync(aget_workflow)(flow.id).steps) == 2
        assert not _seen_by_another_connection(job.id)
        raise _RolledBack
    assert not Job.objects.exists() and not Workflow.objects.exists()

    with transaction.atomic():
        job = async_to_sync(add.aenqueue)(5, 6)
        assert not _seen_by_another_connection(job.id)
    assert _seen_by_another_connection(job.id)


# --------------------------------------------------------------------------- bad input


def _priority_slipped_past_using() -> LeaseTask:
    sneaky = add.using(priority=1)
    object.__setattr__(sneaky, "priority", "high")  # as if built without validation
    return sneaky


def _bad_step_chain() -> Chain:
    return chain(step(add, 1, 2), step(add, {"when": object()}))


BadCall = tuple[type[Exception], Callable[[], object], Callable[[], Awaitable[object]]]

BAD_CALLS: dict[str, BadCall] = {
    "arguments that are not JSON": (
        InvalidTaskArguments,
        lambda: add.enqueue(1, {2}),
        lambda: add.aenqueue(1, {2}),
    ),
    "a priority slipped past using()": (
        InvalidTask,
        lambda: _priority_slipped_past_using().enqueue(1, 2),
        lambda: _priority_slipped_past_using().aenqueue(1, 2),
    ),
    "a debounced workflow step": (
        InvalidTask,
        lambda: chain(step(add.using(key="k", debounce=5), 1, 2)).enqueue(),
        lambda: chain(step(add.using(key="k", debounce=5), 1, 2)).aenqueue(),
    ),
    "a workflow step's arguments": (
        InvalidTaskArguments,
        lambda: _bad_step_chain().enqueue(),
        lambda: _bad_step_chain().aenqueue(),
    ),
    "a result id that is not a number": (
        TaskResultDoesNotExist,
        lambda: backend().get_result("not-a-number"),
        lambda: backend().aget_result("not-a-number"),
    ),
    "no such result": (
        TaskResultDoesNotExist,
        lambda: add.get_result("424242424"),
        lambda: add.aget_result("424242424"),
    ),
    "no such workflow": (
        WorkflowDoesNotExist,
        lambda: get_workflow("424242424"),
        lambda: aget_workflow("424242424"),
    ),
}


@pytest.mark.django_db
@pytest.mark.parametrize("case", BAD_CALLS)
def test_bad_input_raises_what_the_sync_call_raises_and_stores_nothing(
    case: str, nothing_stored: None
) -> None:
    expected, sync_call, async_call = BAD_CALLS[case]
    with pytest.raises(expected) as sync_error:
        sync_call()

    async def awaited() -> object:
        return await async_call()

    with pytest.raises(expected) as async_error:
        async_to_sync(awaited)()
    assert type(async_error.value) is type(sync_error.value)
    assert str(async_error.value) == str(sync_error.value)


@pytest.mark.django_db
def test_aget_result_of_a_row_of_an_unregistered_task_raises_as_get_result_does() -> None:
    job = Job.objects.create(task_path="tests.tasks.not_a_task", args=[1])
    with pytest.raises(UnknownTask) as sync_error:
        backend().get_result(str(job.pk))
    with pytest.raises(UnknownTask) as async_error:
        async_to_sync(backend().aget_result)(str(job.pk))
    assert str(async_error.value) == str(sync_error.value)
