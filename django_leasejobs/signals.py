"""Django signals sent by django-leasejobs (besides django.tasks' own signals).

Every signal is sent with ``sender`` = the backend class (``LeaseJobsBackend``)
and keyword argument ``backend`` (alias); the job signals also with ``job_id``, and
those a worker sends (all but ``job_enqueued`` and ``job_reaped``) with ``queue``
too; the worker signals (a worker's life, not one job's) with ``worker_id``; plus the
ones listed.
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
"""A worker's heartbeat ended: the renewal of its leases, or, while it holds none, the
update of its registry row. Extra: worker_id, duration (seconds), error (the
``DatabaseError`` that failed it, or None)."""


worker_started = Signal()
"""A worker is ready: registered, its slots and threads up, about to claim (also after
its ``--metrics-port`` server listens). Extra: worker_id, pool (``"process"`` or
``"thread"``), concurrency, queues (a tuple of names, or None: every queue), pid."""

worker_stopping = Signal()
"""A stop signal reached a worker. Extra: worker_id, reason (the signal's name:
``"SIGTERM"``, ``"SIGINT"`` or ``"SIGHUP"``) and forced: False for the first (stop
claiming, let running jobs finish), True for a second one (stop running jobs now and
release them). A repeated SIGHUP does not force and is not sent again. Not sent when a
worker ends by itself (``--burst``, ``--max-jobs``): ``worker_stopped`` is."""

worker_stopped = Signal()
"""A worker stopped: its threads ended, its registry row deregistered, it is about to
exit. Extra: worker_id, attempts (attempts it finished in its life)."""

listening_changed = Signal()
"""Whether a worker's listener (PostgreSQL ``LISTEN``) wakes it at once. Extra: worker_id,
listening (bool), reason (None while listening; ``"connection_failed"``: the listener's
connection failed, the worker polls and the listener tries again, each failed try sent
again; ``"pooler"``: the connection goes through a connection pooler, the worker polls
for good), error (what failed or why the connection counts as pooled; None while
listening). Not sent when the worker stops."""

worker_idle = Signal()
"""A worker's claim found no job: it looks again after ``wait`` seconds unless a
notification, a slot or a stop wakes it first. Extra: worker_id, wait (seconds),
listening (bool: waiting on ``NOTIFY``, so ``wait`` is the safety poll or the next
delayed job's due time; else it polls every ``POLL_INTERVAL``), passed_over (bool: a
``--burst`` worker's claim read past a due job whose row another transaction held
locked; the worker looks again rather than exit, for up to 5 seconds)."""

prefetch_returned = Signal()
"""A worker gives back prefetched jobs that waited too long for a slot (behind long jobs),
so other workers can run them. Extra: worker_id, count (jobs), waited (seconds the
longest-waiting one waited)."""

alert_fired = Signal()
"""A rule of ``OPTIONS["ALERTS"]`` fired: sent by the one worker whose fenced write took
the rule's alert, at most once per rule per ``interval`` across every worker. Extra:
worker_id (the worker that sends it), alert (a ``django_leasejobs.alerts.Alert``: rule,
kind, state ``"firing"``, value, threshold, queue, task, message, fired_at, interval).
Receivers run in that worker's alert thread: send mail or post a webhook from a job they
enqueue, not in the receiver (docs/monitoring.md)."""

alerts_evaluated = Signal()
"""A worker's alert thread ended a pass over the backend's ``ALERTS`` rules. Extra:
worker_id, rules (how many), delivered (alerts it fired or resolved), duration
(seconds), error (the ``DatabaseError`` that failed it, or None)."""

alert_resolved = Signal()
"""A firing rule's condition no longer holds: sent once, by the worker whose write marked
it resolved. Extra: worker_id, alert (state ``"resolved"``, the value measured then,
fired_at of the alert it ends, resolved_at)."""
