"""The list filters of the job and worker lists: cheap on a big table, exact matches."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from ..models import ACTIVE_ROWS, FINISHED_STATUSES, Job, JobStatus, Worker
from .clock import database_time_ago


class FieldValueFilter(admin.SimpleListFilter):
    """A list filter whose value is matched exactly against one job column."""

    field: str

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        if self.value():
            return queryset.filter(**{self.field: self.value()})
        return queryset


class TaskFilter(FieldValueFilter):
    title = _("task")
    parameter_name = "task"
    field = "task_path"

    def lookups(self, request: HttpRequest, model_admin: Any) -> Iterable[tuple[str, str]]:
        # Tasks of active jobs plus recently finished ones: cheap on a big table.
        recent = database_time_ago(3600)
        paths = (
            Job.objects.filter(
                ACTIVE_ROWS | Q(status__in=FINISHED_STATUSES, finished_at__gte=recent)
            )
            .values_list("task_path", flat=True)
            .distinct()
            .order_by("task_path")[:200]
        )
        # Dead letters of any age, through their own small partial index.
        dead = (
            Job.objects.filter(status=JobStatus.DEAD)
            .values_list("task_path", flat=True)
            .distinct()
            .order_by("task_path")[:200]
        )
        return [(path, path) for path in sorted({*paths, *dead})]


class QueueFilter(FieldValueFilter):
    """Queues the backends declare plus those of active jobs (no DISTINCT over the table)."""

    title = _("queue")
    parameter_name = "queue"
    field = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> Iterable[tuple[str, str]]:
        from ..backend import LeaseJobsBackend
        from ..compat import task_backends

        names = {
            queue
            for backend in task_backends.all()
            if isinstance(backend, LeaseJobsBackend)
            for queue in backend.queues
        }
        names.update(Job.objects.filter(ACTIVE_ROWS).values_list("queue", flat=True).distinct())
        chosen = self.value()
        if chosen:
            names.add(chosen)
        return [(name, name) for name in sorted(names)]


class WorkerFilter(FieldValueFilter):
    """``?worker=<id>``: jobs a worker holds (linked from the worker list; not shown)."""

    title = _("worker")
    parameter_name = "worker"
    field = "locked_by"

    def lookups(self, request: HttpRequest, model_admin: Any) -> Iterable[tuple[str, str]]:
        value = self.value()
        return [(value, value)] if value else []


class HasErrorsFilter(admin.SimpleListFilter):
    title = _("has errors")
    parameter_name = "has_errors"

    def lookups(self, request: HttpRequest, model_admin: Any) -> Iterable[tuple[str, Any]]:
        return [("yes", _("Yes")), ("no", _("No"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        if self.value() == "yes":
            return queryset.exclude(last_error="")
        if self.value() == "no":
            return queryset.filter(last_error="")
        return queryset


class WorkerProblemFilter(admin.SimpleListFilter):
    title = _("problem")
    parameter_name = "problem"

    def lookups(self, request: HttpRequest, model_admin: Any) -> Iterable[tuple[str, Any]]:
        return (("yes", _("reports a problem")), ("no", _("no problem")))

    def queryset(self, request: HttpRequest, queryset: QuerySet[Worker]) -> QuerySet[Worker]:
        if self.value() == "yes":
            return queryset.exclude(problem="")
        if self.value() == "no":
            return queryset.filter(problem="")
        return queryset
