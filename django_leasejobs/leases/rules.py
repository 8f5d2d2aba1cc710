"""Each rule of a job's life, decided in one place.

Every path (the batched statements on PostgreSQL and SQLite, the portable statements
on MySQL/MariaDB) builds its SQL from the fragments below, so a rule changed here
changes on every database at once:

* a requested cancel wins over every ending but success (a retry, a final failure, a
  release, an unclaim, the reap): :func:`cancel_wins`; an attempt that succeeded
  before its worker saw the request stays ``succeeded``, its result kept;
* an attempt that did not succeed is retried when the caller gave a delay and the job
  has attempts left, else it takes the caller's ending: :func:`ending_status`;
* a snooze (the task raised ``Retry`` within its ``max_snoozes``) is retried whatever
  attempts are left and gives its attempt back (``max_attempts`` + 1, ``snoozes`` + 1):
  :func:`snoozing`; whether a ``Retry`` is a snooze, and what the attempt row says about
  the retry, is decided by :func:`decide`;
* a reaped job becomes ``dead`` when its stalls reach ``max_stalls``, else ``failed``
  when its attempts are used up, else ``pending``: :func:`reaped_status`;
* what ``last_error`` says, and how long stored text may be (from the model fields).

The fragments take a ``value`` function that returns the SQL for one of the caller's
per-row values (a bound parameter, or a column of a ``VALUES`` list), called once per
appearance, in the order the values appear in the statement. They read the job row as
``j`` and never read a column the same UPDATE assigns: MySQL evaluates ``SET`` from left
to right, so every statement assigns the columns these fragments read
(``cancel_requested``, ``stall_count``) last.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.db.models import CharField

from ..models import Job, JobAttempt
from ..retry import Decision, Verdict

Value = Callable[[str], str]
"""Returns the SQL for one per-row value, by name."""

MAX_ERROR_LENGTH = 2000
"""``Job.last_error`` and ``JobAttempt.error_message`` (text columns: a chosen limit)."""
MAX_TRACEBACK_LENGTH = 64_000
"""``JobAttempt.traceback`` (a text column: a chosen limit)."""


def _max_length(model: type[Job] | type[JobAttempt], name: str) -> int:
    field = model._meta.get_field(name)
    if not isinstance(field, CharField) or field.max_length is None:
        raise TypeError(f"{model.__name__}.{name} is not a CharField with a max_length")
    return field.max_length


MAX_ERROR_CLASS_LENGTH = _max_length(JobAttempt, "error_class")
MAX_PROGRESS_MESSAGE_LENGTH = _max_length(Job, "progress_message")
MAX_DECISION_LENGTH = _max_length(JobAttempt, "decision")


def storable_text(value: object, limit: int | None = None) -> str:
    """``value`` as text every supported database stores unchanged.

    For what a job *reports* (error messages, tracebacks, progress messages), which
    must never stop the worker from recording the attempt: a NUL character (which
    PostgreSQL text cannot hold) becomes the four characters ``\\x00``, a lone
    surrogate (which UTF-8 cannot encode) its ``\\udXXX`` escape, and text longer
    than ``limit`` is cut with a marker saying how much was dropped. Values that are
    not ``str`` are converted with ``str()``; if that raises, a description of the
    failure is stored instead. (Arguments, results and checkpoints are refused at
    the door instead: see ``serialization.py``.)
    """
    if isinstance(value, str):
        text = "".join((value,))  # a plain str, whatever a subclass overrides
    else:
        try:
            text = "".join((str(value),))
        except Exception as exc:  # a hostile __str__ must not escape
            text = f"<unprintable {type(value).__name__}: str() raised {type(exc).__name__}>"
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if limit is not None and len(text) > limit:
        kept = limit
        for _ in range(2):  # the marker's length depends on the number it gives
            marker = f"... [truncated {len(text) - kept} characters]"
            kept = max(limit - len(marker), 0)
        text = (text[:kept] + marker)[:limit]
    return text


def progress_message(message: str | None) -> str | None:
    """A progress message as stored (None: keep the stored one)."""
    return None if message is None else storable_text(message, MAX_PROGRESS_MESSAGE_LENGTH)


def last_error_text(exception_class_path: str, message: str) -> str:
    """The job row's ``last_error`` for an attempt's error."""
    return f"{exception_class_path}: {message}" if message else exception_class_path


REAP_ERROR_CLASS = "django_leasejobs.exceptions.LeaseExpired"
REAP_ERROR_MESSAGE = (
    "lease expired: the worker stopped renewing it (it died, froze or lost the database)"
)
RELEASED_ERROR_CLASS = "django_leasejobs.exceptions.JobReleased"
COLLATERAL_ERROR_CLASS = "django_leasejobs.exceptions.KilledWithNeighbour"
TIMEOUT_ERROR_CLASS = "django_leasejobs.exceptions.TaskTimeout"
"""The error of an attempt that ran past its timeout (the worker's watchdog, the testing kit)."""
CANCELLED_ERROR_CLASS = "django_leasejobs.exceptions.JobCancelled"
CANCELLED_ERROR_MESSAGE = "cancelled while running"


def released_error_message(worker_id: str) -> str:
    return f"worker {worker_id} shut down and released the job"


@dataclass(frozen=True, slots=True)
class AttemptDecision:
    """How a failed attempt's job goes on (the fields of its ``Failure``)."""

    retry_delay: float | None
    """Seconds until it runs again; None: failed for good."""
    snooze: bool
    decision: str
    """What the attempt row says about it."""


def decide(
    verdict: Verdict,
    *,
    attempt: int,
    max_attempts: int,
    snoozes: int,
    max_snoozes: int,
    backoff_delay: Callable[[], float],
) -> AttemptDecision:
    """The ending of a failed attempt from what its slot decided (``retry.verdict``).

    A ``Retry`` is a snooze while the job has taken fewer than ``max_snoozes``; past
    that it is a failed attempt retried after its own ``after`` (when attempts are
    left). ``backoff_delay`` gives the policy's delay when the verdict brings none.
    """
    reason = f"{verdict.reason}: " if verdict.reason else ""
    if verdict.decision == Decision.FAIL:
        return AttemptDecision(None, False, _decision_text(verdict.reason))
    if verdict.decision == Decision.SNOOZE and verdict.seconds is not None:
        if snoozes < max_snoozes:
            text = f"snoozed for {verdict.seconds:g}s ({snoozes + 1} of {max_snoozes})"
            return AttemptDecision(verdict.seconds, True, _decision_text(text))
        reason = f"Retry past the {max_snoozes} snoozes allowed, counted as a failed attempt: "
    delay = backoff_delay() if verdict.seconds is None else verdict.seconds
    if attempt < max_attempts:
        text = f"{reason}retried in {delay:.3g}s (attempt {attempt} of {max_attempts})"
        return AttemptDecision(delay, False, _decision_text(text))
    text = f"{reason}not retried: attempt {attempt} of {max_attempts} was the last"
    return AttemptDecision(delay, False, _decision_text(text))


def _decision_text(text: str) -> str:
    return storable_text(text, MAX_DECISION_LENGTH)


UNKNOWN_TASK_FIRST_DELAY = 2.0
UNKNOWN_TASK_MAX_DELAY = 60.0


def unknown_task_delay(waited: float) -> float:
    """Seconds until a job whose task its worker did not know may be claimed again, after
    it waited ``waited`` seconds for a worker that knows it: 2 s at first, a quarter of
    the wait later on, at most a minute (a worker that starts with the new code takes it
    within a minute)."""
    return min(UNKNOWN_TASK_MAX_DELAY, max(UNKNOWN_TASK_FIRST_DELAY, waited / 4))


def unknown_task_stand_aside(delay: float, waited: float, grace: float) -> float:
    """Seconds a worker that gave back a job of a task it does not know claims no job of
    that task (after the give-back's ``delay``, ``waited`` seconds into the wait, with
    ``UNKNOWN_TASK_GRACE`` ``grace``): a minute, so that a worker that knows the task
    takes it when it comes due, rather than the same worker again; but never past the
    grace's end (the worker that claims it then dead-letters it) nor shorter than the
    delay."""
    return max(delay, min(UNKNOWN_TASK_MAX_DELAY, grace - waited))


# --------------------------------------------------------------------------- SQL decisions


def cancel_wins(otherwise: str) -> str:
    """The status of a job leaving ``running`` other than by success: ``cancelled`` when a
    cancel was requested while it ran, else ``otherwise``."""
    return f"CASE WHEN j.cancel_requested THEN 'cancelled' ELSE {otherwise} END"


def retrying(value: Value) -> str:
    """True when an attempt that did not succeed is retried: no cancel requested, the
    caller gave a delay (``value('delay')``), and the job has attempts left or the
    attempt is a snooze (``value('snooze')``, 1 or 0)."""
    return (
        f"(NOT j.cancel_requested AND {value('delay')} IS NOT NULL "
        f"AND j.attempt < j.max_attempts + {value('snooze')})"
    )


def snoozing(value: Value) -> str:
    """1 when the attempt is a snooze that is retried (no cancel requested), else 0: what
    the UPDATE adds to ``max_attempts`` (the attempt is given back) and ``snoozes``."""
    return f"CASE WHEN j.cancel_requested THEN 0 ELSE {value('snooze')} END"


def ending_status(value: Value) -> str:
    """The status an attempt that did not succeed leaves its job in: ``cancelled`` if a
    cancel was requested, ``pending`` if it is retried (:func:`retrying`), else the
    caller's ending, ``value('otherwise')`` (``failed``; ``pending`` for a release;
    ``cancelled`` for a job stopped on request)."""
    return f"CASE WHEN {retrying(value)} THEN 'pending' ELSE {cancel_wins(value('otherwise'))} END"


def ending_is_final(value: Value) -> str:
    """True when :func:`ending_status` is a final status (``finished_at`` is set)."""
    return f"({ending_status(value)}) <> 'pending'"


def reaped_status() -> str:
    """The status of a job whose lease expired (its stall is counted by the same UPDATE)."""
    return cancel_wins(
        "CASE WHEN j.stall_count + 1 >= j.max_stalls THEN 'dead' "
        "WHEN j.attempt >= j.max_attempts THEN 'failed' ELSE 'pending' END"
    )


def reaped_is_final() -> str:
    """True when :func:`reaped_status` is a final status."""
    return (
        "(j.cancel_requested OR j.stall_count + 1 >= j.max_stalls OR j.attempt >= j.max_attempts)"
    )
