"""Django signals sent by django-leasejobs (besides django.tasks' own signals).

Every signal is sent with ``sender`` = the backend class (``LeaseJobsBackend``)
and keyword argument ``backend`` (alias); the job signals also with ``job_id``, and
those a worker sends (all but ``job_enqueued`` and ``job_reaped``) with ``queue``
too; plus the ones listed.
Receivers run in the process that made the transition (producer, worker or
reaper); they are called with ``send_robust``, so an exception in a receiver is
logged, never raised into the transition.
"""

from django.dispatch import Signal

job_enqueued = Signal()
"""A job was stored (sent after the enqueueing transaction commits). Extra: task_path, queue."""

job_started = Signal()
"""A worker claimed an attempt and starts running it. Extra: attempt, worker_id, task_path,
enqueued_at and claimed_at (the job's enqueue time and this attempt's claim, database clock)."""

job_succeeded = Signal()
"""An attempt succeeded and was recorded. Extra: attempt, worker_id, task_path, duration."""

job_failed = Signal()
"""An attempt failed and was recorded. Extra: attempt, worker_id, task_path, status, error
(the recorded ``ErrorInfo``) and exception (the attempt's error rebuilt as a
``django_leasejobs.exceptions.TaskFailed``, named after the task's exception class, with
the traceback recorded where it ran; also the exception being handled while receivers
run), duration (seconds the attempt ran)."""

job_reaped = Signal()
"""The reaper recovered an attempt whose lease expired. Extra: attempt, worker_id, status."""

lease_lost = Signal()
"""A worker found it no longer holds an attempt's lease. Extra: attempt, worker_id, reason."""

jobs_claimed = Signal()
"""A worker's claim round returned (also when it found nothing). Extra: worker_id, count
(jobs claimed), limit (jobs asked for)."""

heartbeat_sent = Signal()
"""A worker's heartbeat (lease renewal and registry touch) ended. Extra: worker_id,
duration (seconds), error (the ``DatabaseError`` that failed it, or None)."""
