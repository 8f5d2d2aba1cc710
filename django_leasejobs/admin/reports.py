"""What an admin action changed and skipped, reported once (job and schedule actions)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest
from django.utils.translation import ngettext


class ActionReport:
    """Counts what an admin action changed and skipped (and why), then reports it once.

    Used by the job and the schedule admins; ``noun`` names what the action works on.
    """

    def __init__(
        self, admin_obj: admin.ModelAdmin[Any], request: HttpRequest, verb: str, noun: str = "job"
    ) -> None:
        self.admin = admin_obj
        self.request = request
        self.verb = verb
        self.noun = noun
        self.changed = 0
        self.skipped: dict[str, int] = {}
        self.jobs: list[int] = []
        """Jobs the action enqueued (a schedule's run now)."""

    def done(self, obj: Any, log_message: str, job_id: int | None = None) -> None:
        self.changed += 1
        self.admin.log_change(self.request, obj, log_message)
        if job_id is not None:
            self.jobs.append(job_id)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def send(self) -> None:
        level = messages.SUCCESS if self.changed else messages.WARNING
        text = f"{self.verb} {self.changed} {self.noun}{'s' if self.changed != 1 else ''}."
        if self.jobs:
            noun = ngettext("job", "jobs", len(self.jobs))
            text += f" Enqueued {noun} {', '.join(f'#{i}' for i in self.jobs)}."
        if self.skipped:
            reasons = "; ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))
            text += f" Skipped {sum(self.skipped.values())}: {reasons}."
        self.admin.message_user(self.request, text, level)
