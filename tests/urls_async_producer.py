"""URLconf of tests/backend/test_async_producer.py: an async view that uses the async
producer API as a site would, from a request served through Django's ASGI handler."""

from __future__ import annotations

import threading

from django.db.models.functions import Now
from django.http import HttpRequest, JsonResponse
from django.urls import path

from django_leasejobs.compat import TaskResult, task_backends
from django_leasejobs.models import Job, JobStatus
from django_leasejobs.workflows import WorkflowResult, aget_workflow, chain, step
from tests.tasks import add


def _seen(result: TaskResult) -> dict[str, object]:
    return {"id": result.id, "status": result.status.name, "args": result.args}


async def _succeed(job_ids: list[int], value: int) -> None:
    """Mark jobs succeeded with ``value``, as a worker would (Django's async ORM)."""
    await Job.objects.filter(pk__in=job_ids).aupdate(
        status=JobStatus.SUCCEEDED, result=value, finished_at=Now()
    )


async def enqueue_and_read(request: HttpRequest) -> JsonResponse:
    """Enqueue a job and a workflow, read them back, let them "succeed", refresh them."""
    a, b = int(request.GET["a"]), int(request.GET["b"])
    enqueued = await add.aenqueue(a, b)
    fetched = await task_backends["default"].aget_result(enqueued.id)
    through_task = await add.aget_result(enqueued.id)
    flow: WorkflowResult = await chain(step(add, a, b), step(add, b, a)).aenqueue()
    found = await aget_workflow(flow.id)
    before = {"job": _seen(fetched), "workflow": flow.status.name}
    await _succeed([int(enqueued.id), *(int(s.id) for s in flow.steps)], a + b)
    await fetched.arefresh()
    await flow.arefresh()
    return JsonResponse(
        {
            "loop_thread": threading.get_ident(),
            "enqueued": _seen(enqueued),
            "through_task": _seen(through_task),
            "before": before,
            "after": {
                "job": _seen(fetched),
                "return_value": fetched.return_value,
                "workflow": flow.status.name,
            },
            "workflow": flow.id,
            "steps": [_seen(s) for s in flow.steps],
            "found_steps": [s.id for s in found.steps],
        }
    )


urlpatterns = [path("enqueue/", enqueue_and_read)]
