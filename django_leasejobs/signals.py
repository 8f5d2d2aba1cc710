"""Django signals sent by django-leasejobs (besides django.tasks' own signals).

Every signal is sent with ``sender`` = the backend class (``LeaseJobsBackend``)
and keyword arguments ``job_id``, ``backend`` (alias) and the ones listed.
Receivers run in the process that made the transition (producer, worker or
reaper); they are called with ``send_robust``, so an exception in a receiver is
logged, never raised into the transition.
"""

from django.dispatch import Signal

job_enqueued = Signal()
"""A job was stored (sent after the enqueueing transaction commits). Extra: task_path, queue."""

job_started = Signal()
"""A worker claimed an attempt and starts running it. Extra: attempt, worker_id, task_path."""

job_succeeded = Signal()
"""An attempt succeeded and was recorded. Extra: attempt, worker_id, task_path, duration."""

job_failed = Signal()
"""An attempt failed and was recorded. Extra: attempt, worker_id, task_path, status, error
(the recorded ``ErrorInfo``) and exception (the attempt's error rebuilt as a
``django_leasejobs.exceptions.TaskFailed``, named after the task's exception class, with
the traceback recorded where it ran; also the exception being handled while receivers
run)."""

job_reaped = Signal()
"""The reaper recovered an attempt whose lease expired. Extra: attempt, worker_id, status."""

lease_lost = Signal()
"""A worker found it no longer holds an attempt's lease. Extra: attempt, worker_id, reason."""
