"""The testing kit (django_leasejobs.testing) inside ``django.test.TestCase``.

Every test here runs in TestCase's transaction, which is never committed: the kit claims,
runs and records jobs on the test's own connection, with the worker's functions
(``leases.claim``, ``execution.execute``, the fenced transitions).
"""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth.models import User
from django.db import connection
from django.test import TestCase
from django.utils import timezone

from django_leasejobs import leases, task
from django_leasejobs.compat import task_finished, task_started
from django_leasejobs.leases import CancelResult, LeaseLost
from django_leasejobs.models import AttemptOutcome, Job, JobAttempt, JobStatus
from django_leasejobs.testing import JobRun, LeaseJobsTestMixin, arun_jobs, run_jobs
from django_leasejobs.worker.execution import JobContext
from tests import tasks_testing_kit as kit_tasks


@task(takes_context=True)
def loses_its_lease(context: JobContext, username: str) -> str:
    """Writes a row, then its lease goes to another worker (as a reaper and a new claim
    would take it): recording its success finds the lease lost."""
    User.objects.create(username=username)
    Job.objects.filter(pk=context.job_id).update(locked_by="another-worker")
    return "done"


class RunJobsTests(LeaseJobsTestMixin, TestCase):
    def setUp(self) -> None:
        kit_tasks.SEEN.clear()  # job ids come again after a rollback

    def test_runs_in_the_test_transaction(self) -> None:
        self.assertTrue(connection.in_atomic_block)  # TestCase's transaction
        result = kit_tasks.multiply.enqueue(6, 7)
        [run] = self.run_jobs()
        self.assertIsInstance(run, JobRun)
        self.assertEqual(run.job_id, int(result.id))
        self.assertEqual(run.task_path, kit_tasks.multiply.module_path)
        self.assertEqual((run.attempt, run.status, run.result), (1, "succeeded", 42))
        self.assertTrue(run.succeeded)
        self.assertTrue(run.finished)
        self.assertIsNone(run.error)
        job = Job.objects.get(pk=run.job_id)
        self.assertEqual(
            (job.status, job.result, job.last_worker), ("succeeded", 42, "test-worker")
        )
        self.assertIsNone(job.locked_by)
        self.assertEqual(result.task.get_backend().get_result(result.id).return_value, 42)
        self.assertEqual(self.run_jobs(), [])  # nothing left

    def test_failed_attempt_is_retried_on_the_next_run_with_scheduled_jobs(self) -> None:
        result = kit_tasks.flaky.enqueue(failures=1)
        [first] = self.run_jobs()
        self.assertEqual((first.attempt, first.status), (1, "pending"))
        self.assertEqual(first.outcome, AttemptOutcome.ERROR)
        self.assertEqual(first.retry_delay, 60)  # the task's A_MINUTE backoff
        self.assertEqual(first.error.exception_class_path, "tests.tasks_testing_kit.Transient")
        self.assertEqual(first.error.message, "attempt 1 fails")
        self.assertIn("retried in 60s (attempt 1 of 3)", first.decision)
        job = Job.objects.get(pk=result.id)
        self.assertGreater(job.run_after, leases.database_now() + timedelta(seconds=50))
        self.assertEqual(self.run_jobs(), [])  # the retry is not due yet
        [second] = self.run_jobs(include_scheduled=True)
        self.assertEqual((second.attempt, second.status), (2, "succeeded"))
        self.assertEqual(second.result, {"attempt": 2, "job_id": int(result.id)})
        attempts = JobAttempt.objects.filter(job_id=result.id)
        self.assertEqual(
            [(a.attempt, a.outcome, a.worker) for a in attempts], [(1, "error", "test-worker")]
        )
        stored = result.task.get_backend().get_result(result.id)
        self.assertEqual(stored.worker_ids, ["test-worker", "test-worker"])
        self.assertEqual(len(stored.errors), 1)

    def test_include_scheduled_runs_until_attempts_are_used_up(self) -> None:
        kit_tasks.flaky.enqueue(failures=5)
        runs = self.run_jobs(include_scheduled=True)
        self.assertEqual(
            [(r.attempt, r.status) for r in runs], [(1, "pending"), (2, "pending"), (3, "failed")]
        )
        self.assertIn("not retried: attempt 3 of 3 was the last", runs[-1].decision)
        self.assertIsNone(runs[-1].retry_delay)

    def test_dont_retry_on_fails_at_once(self) -> None:
        kit_tasks.rejects_input.enqueue("x")
        [run] = self.run_jobs(include_scheduled=True)
        self.assertEqual((run.attempt, run.status), (1, "failed"))
        self.assertEqual(run.error.exception_class_path, "builtins.ValueError")
        self.assertEqual(run.decision, "not retried: ValueError is in dont_retry_on")

    def test_retry_on(self) -> None:
        kit_tasks.retried_on_transient.enqueue("transient")
        kit_tasks.retried_on_transient.enqueue("other")
        transient, other = self.run_jobs()
        self.assertEqual(transient.status, "pending")
        self.assertEqual(
            transient.decision, "Transient is in retry_on: retried in 60s (attempt 1 of 3)"
        )
        self.assertEqual(other.status, "failed")
        self.assertEqual(other.decision, "not retried: KeyError is not in retry_on")

    def test_retry_after_snoozes_without_using_an_attempt(self) -> None:
        result = kit_tasks.snoozes_once.enqueue(after=300)
        [snoozed] = self.run_jobs()
        self.assertEqual((snoozed.status, snoozed.outcome), ("pending", AttemptOutcome.SNOOZED))
        self.assertEqual(snoozed.retry_delay, 300)
        self.assertEqual(snoozed.decision, "snoozed for 300s (1 of 10)")
        job = Job.objects.get(pk=result.id)
        self.assertEqual((job.snoozes, job.max_attempts), (1, 2))  # the attempt was given back
        self.assertGreater(job.run_after, leases.database_now() + timedelta(seconds=250))
        [woke] = self.run_jobs(include_scheduled=True)
        self.assertEqual((woke.attempt, woke.status, woke.result), (2, "succeeded", "woke up"))

    def test_progress_is_stored_on_the_row(self) -> None:
        failing = kit_tasks.reports_progress.enqueue(4, fail=True)
        ok = kit_tasks.reports_progress.enqueue(2)
        runs = self.run_jobs()
        self.assertEqual([r.status for r in runs], ["failed", "succeeded"])
        # The task read its own row right after each set_progress: already stored.
        self.assertEqual(kit_tasks.SEEN[int(failing.id)]["step 2"], (0.5, "step 2 of 4"))
        job = Job.objects.get(pk=failing.id)
        self.assertEqual((job.progress, job.progress_message), (1.0, "step 4 of 4"))
        self.assertEqual(Job.objects.get(pk=ok.id).progress, 1.0)

    def test_checkpoint_is_seen_by_the_next_attempt(self) -> None:
        result = kit_tasks.resumes_from_checkpoint.enqueue()
        first, second = self.run_jobs(include_scheduled=True)
        self.assertEqual((first.status, second.status), ("pending", "succeeded"))
        self.assertEqual(second.result, {"resumed_at": 500})
        self.assertEqual(kit_tasks.SEEN[int(result.id)], {"attempt 1": 0, "attempt 2": 500})
        self.assertEqual(Job.objects.get(pk=result.id).checkpoint, {"row": 500})

    def test_cancel_seen_at_a_renewal_stops_the_job(self) -> None:
        result = kit_tasks.cancelled_while_running.enqueue()
        [run] = self.run_jobs()
        seen = kit_tasks.SEEN[int(result.id)]
        self.assertEqual(seen["cancel"], CancelResult.REQUESTED)
        self.assertEqual((seen["lost before"], seen["lost after"]), (False, True))
        self.assertEqual((run.status, run.outcome), ("cancelled", AttemptOutcome.CANCELLED))
        self.assertEqual(run.error.exception_class_path, "django_leasejobs.exceptions.JobCancelled")
        self.assertIsNone(run.result)
        job = Job.objects.get(pk=result.id)
        self.assertEqual((job.status, job.result), ("cancelled", None))
        self.assertEqual(JobAttempt.objects.get(job_id=result.id).outcome, "cancelled")

    def test_a_cancel_requested_wins_over_a_retry(self) -> None:
        result = kit_tasks.cancelled_then_fails.enqueue()
        [run] = self.run_jobs(include_scheduled=True)
        self.assertEqual(run.status, "cancelled")
        self.assertEqual(run.decision, "not retried: cancelled while it ran")
        self.assertEqual(Job.objects.get(pk=result.id).status, "cancelled")

    def test_a_cancel_not_seen_lets_a_success_stand(self) -> None:
        result = kit_tasks.cancel_requested_then_returns.enqueue()
        [run] = self.run_jobs()
        self.assertEqual((run.status, run.result), ("succeeded", "done before the cancel was seen"))
        job = Job.objects.get(pk=result.id)
        self.assertEqual((job.status, job.cancel_requested), ("succeeded", False))

    def test_progress_after_the_timeout_flags_lease_lost(self) -> None:
        result = kit_tasks.reports_progress_past_timeout.enqueue()
        [run] = self.run_jobs()
        seen = kit_tasks.SEEN[int(result.id)]
        self.assertEqual((seen["lost before"], seen["lost after"]), (False, True))
        self.assertEqual((run.status, run.outcome, run.result), ("failed", "timeout", None))
        self.assertEqual(Job.objects.get(pk=result.id).progress, 0.9)

    def test_a_cancelled_pending_job_never_runs(self) -> None:
        result = kit_tasks.multiply.enqueue(1, 2)
        self.assertEqual(leases.cancel(int(result.id)), CancelResult.CANCELLED)
        self.assertEqual(self.run_jobs(), [])

    def test_an_attempt_past_its_timeout_is_recorded_as_a_timeout(self) -> None:
        kit_tasks.overruns_timeout.enqueue()
        first, second = self.run_jobs(include_scheduled=True)
        self.assertEqual((first.status, first.outcome), ("pending", AttemptOutcome.TIMEOUT))
        self.assertEqual(
            first.error.exception_class_path, "django_leasejobs.exceptions.TaskTimeout"
        )
        self.assertIn("ran past its timeout of 0.01s", first.error.message)
        self.assertEqual((second.attempt, second.status), (2, "failed"))

    def test_unknown_task_ends_with_an_attempt_row(self) -> None:
        job = Job.objects.create(task_path="tests.tasks_testing_kit.no_such_task")
        [run] = self.run_jobs()
        self.assertEqual((run.job_id, run.status), (job.pk, "failed"))
        self.assertEqual(run.error.exception_class_path, "django_leasejobs.exceptions.UnknownTask")
        attempt = JobAttempt.objects.get(job_id=job.pk)
        self.assertEqual(
            (attempt.outcome, attempt.error_class), ("error", run.error.exception_class_path)
        )

    def test_malformed_row_ends_with_an_attempt_row(self) -> None:
        job = Job.objects.create(task_path=kit_tasks.multiply.module_path, args={"a": 1})
        [run] = self.run_jobs()
        self.assertEqual(run.status, "failed")
        self.assertEqual(
            run.error.exception_class_path, "django_leasejobs.exceptions.InvalidTaskArguments"
        )
        self.assertIn("args is a JSON object, not an array", run.error.message)
        self.assertTrue(JobAttempt.objects.filter(job_id=job.pk).exists())

    def test_queue_filter(self) -> None:
        low = kit_tasks.low_priority_work.enqueue("low")
        high = kit_tasks.multiply.using(queue_name="high").enqueue(2, 3)
        default = kit_tasks.multiply.enqueue(1, 1)
        self.assertEqual([r.job_id for r in self.run_jobs(queues="low")], [int(low.id)])
        self.assertEqual([r.job_id for r in self.run_jobs(queues=["high", "low"])], [int(high.id)])
        self.assertEqual([r.queue for r in self.run_jobs()], ["default"])
        self.assertEqual(Job.objects.get(pk=default.id).status, "succeeded")

    def test_max_jobs_and_claim_order(self) -> None:
        later = kit_tasks.multiply.enqueue(1, 1)
        urgent = kit_tasks.multiply.using(priority=10).enqueue(2, 2)
        [run] = self.run_jobs(max_jobs=1)
        self.assertEqual(run.job_id, int(urgent.id))
        self.assertEqual(Job.objects.get(pk=later.id).status, "pending")
        self.assertEqual(self.run_jobs(max_jobs=0), [])

    def test_jobs_enqueued_by_jobs_run_too(self) -> None:
        kit_tasks.enqueues_follow_up.enqueue(4)
        runs = self.run_jobs()
        self.assertEqual(
            [(r.task_path.rsplit(".", 1)[1], r.result) for r in runs],
            [("enqueues_follow_up", 4), ("multiply", 40)],
        )

    def test_run_after_in_the_future_waits_for_include_scheduled(self) -> None:
        tomorrow = timezone.now() + timedelta(days=1)
        result = kit_tasks.multiply.using(run_after=tomorrow).enqueue(3, 3)
        self.assertEqual(self.run_jobs(), [])
        [run] = self.run_jobs(include_scheduled=True)
        self.assertEqual((run.job_id, run.result), (int(result.id), 9))

    def test_a_task_that_breaks_the_transaction(self) -> None:
        User.objects.create(username="taken")
        result = kit_tasks.breaks_the_transaction.enqueue("taken")
        [run] = self.run_jobs()
        self.assertEqual(run.status, "pending")
        self.assertIn("IntegrityError", run.error.exception_class_path)
        # The test's transaction is usable again; the attempt's own writes were undone.
        job = Job.objects.get(pk=result.id)
        self.assertIsNone(job.checkpoint)
        self.assertEqual(JobAttempt.objects.get(job_id=result.id).outcome, "error")
        self.assertTrue(User.objects.filter(username="taken").exists())

    def test_a_lost_lease_rolls_the_attempt_back_to_its_savepoint(self) -> None:
        result = loses_its_lease.enqueue("lost-lease")
        with self.assertRaises(LeaseLost):
            self.run_jobs()
        # Rolled back to the attempt's savepoint: the task's writes are undone, the job
        # is as the claim left it, and the test's transaction goes on.
        self.assertFalse(User.objects.filter(username="lost-lease").exists())
        job = Job.objects.get(pk=result.id)
        self.assertEqual((job.status, job.locked_by), ("running", "test-worker"))
        self.assertFalse(JobAttempt.objects.filter(job_id=job.pk).exists())

    def test_async_task(self) -> None:
        result = kit_tasks.async_double.enqueue(21)
        [run] = self.run_jobs()
        self.assertEqual((run.status, run.result), ("succeeded", {"value": 42, "attempt": 1}))
        job = Job.objects.get(pk=result.id)
        self.assertEqual((job.progress, job.checkpoint), (1.0, {"value": 21}))  # NULL unreported

    async def test_async_task_from_an_async_test(self) -> None:
        """``arun_jobs`` from an ``async def`` test runs in the test's transaction (the
        thread Django's async ORM uses) and takes the async job to its end."""
        result = await kit_tasks.async_double.aenqueue(4)
        [run] = await arun_jobs()
        self.assertEqual((run.status, run.result), ("succeeded", {"value": 8, "attempt": 1}))
        job = await Job.objects.aget(pk=result.id)
        self.assertEqual((job.status, job.checkpoint), (JobStatus.SUCCEEDED, {"value": 4}))
        self.assertEqual(await self.leasejobs_kit.arun_jobs(), [])  # nothing left to run

    def test_django_tasks_signals(self) -> None:
        seen: list[tuple[str, str, str]] = []

        def started(sender, task_result, **kwargs):  # type: ignore[no-untyped-def]
            seen.append(("started", task_result.id, task_result.status))

        def finished(sender, task_result, **kwargs):  # type: ignore[no-untyped-def]
            seen.append(("finished", task_result.id, task_result.status))

        task_started.connect(started)
        task_finished.connect(finished)
        self.addCleanup(task_started.disconnect, started)
        self.addCleanup(task_finished.disconnect, finished)
        result = kit_tasks.flaky.enqueue(failures=1)
        self.run_jobs(include_scheduled=True)
        self.assertEqual(
            seen,
            [
                ("started", result.id, "RUNNING"),
                ("started", result.id, "RUNNING"),  # no task_finished for a retried attempt
                ("finished", result.id, "SUCCESSFUL"),
            ],
        )

    def test_not_a_lease_jobs_backend(self) -> None:
        with self.assertRaisesRegex(TypeError, "not django_leasejobs.backend.LeaseJobsBackend"):
            from django.test import override_settings

            with override_settings(TASKS={"default": {"BACKEND": _dummy_backend()}}):
                run_jobs()


def _dummy_backend() -> str:
    from django_leasejobs.compat import USING_BACKPORT

    return (
        "django_tasks.backends.dummy.DummyBackend"
        if USING_BACKPORT
        else "django.tasks.backends.dummy.DummyBackend"
    )


class AssertionTests(LeaseJobsTestMixin, TestCase):
    def test_assert_enqueued_passes_and_returns_the_rows(self) -> None:
        result = kit_tasks.multiply.enqueue(2, b=3)
        [job] = self.assertEnqueued(kit_tasks.multiply, args=(2,), kwargs={"b": 3})
        self.assertEqual(job.pk, int(result.id))
        self.assertEnqueued(kit_tasks.multiply.module_path, queue="default", priority=0)
        self.assertNotEnqueued(kit_tasks.multiply, args=[3])
        self.assertNotEnqueued(kit_tasks.flaky)

    def test_assert_enqueued_failure_lists_what_was_enqueued(self) -> None:
        kit_tasks.multiply.enqueue(2, 3)
        kit_tasks.low_priority_work.enqueue("x")
        with self.assertRaises(AssertionError) as caught:
            self.assertEnqueued(kit_tasks.multiply, args=[2, 4])
        message = str(caught.exception)
        self.assertIn(
            "Expected 1 pending job(s) of tests.tasks_testing_kit.multiply args=[2, 4], found 0.",
            message,
        )
        self.assertIn(
            "tests.tasks_testing_kit.multiply(2, 3) queue='default' priority=0 status='pending'",
            message,
        )
        self.assertIn("tests.tasks_testing_kit.low_priority_work('x') queue='low'", message)

    def test_assert_not_enqueued_failure_lists_the_matches(self) -> None:
        result = kit_tasks.multiply.enqueue(2, 3)
        with self.assertRaises(AssertionError) as caught:
            self.assertNotEnqueued(kit_tasks.multiply)
        self.assertIn(
            "Expected no pending job of tests.tasks_testing_kit.multiply, found 1:",
            str(caught.exception),
        )
        self.assertIn(f"#{result.id} tests.tasks_testing_kit.multiply(2, 3)", str(caught.exception))

    def test_status_after_running(self) -> None:
        kit_tasks.multiply.enqueue(2, 3)
        self.run_jobs()
        self.assertNotEnqueued(kit_tasks.multiply)  # pending only, by default
        self.assertEnqueued(kit_tasks.multiply, status="succeeded")
        self.assertEnqueued(kit_tasks.multiply, status=None)
        self.assertEqual([j.status for j in self.enqueued_jobs(status=None)], ["succeeded"])

    def test_count(self) -> None:
        for n in range(3):
            kit_tasks.multiply.enqueue(n, n)
        self.assertEnqueued(kit_tasks.multiply, count=3)
        self.assertEnqueued(kit_tasks.multiply, count=None)
        with self.assertRaisesRegex(AssertionError, "Expected 2 pending job"):
            self.assertEnqueued(kit_tasks.multiply, count=2)
        Job.objects.all().delete()
        with self.assertRaisesRegex(
            AssertionError, r"Expected at least 1 .* found 0\.\nNo pending job"
        ):
            self.assertEnqueued(kit_tasks.flaky, count=None)


class JobStatusValuesTests(TestCase):
    def test_job_run_status_values_are_job_statuses(self) -> None:
        values = {str(s) for s in JobStatus}
        kit_tasks.multiply.enqueue(1, 2)
        kit_tasks.rejects_input.enqueue("y")
        self.assertTrue({r.status for r in run_jobs()} <= values)
