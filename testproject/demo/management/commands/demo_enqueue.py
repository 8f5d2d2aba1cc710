"""Enqueue a realistic mix of the demo tasks, so the admin has something to show."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from demo.tasks import add, always_fails, crash_worker, flaky, notify, slow, sync_customer


class Command(BaseCommand):
    help = "Enqueue a mix of demo jobs: quick, slow, delayed, prioritized, flaky and failing."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--quick",
            type=int,
            default=20,
            help="How many quick add() jobs to enqueue (default: 20).",
        )
        parser.add_argument(
            "--seed", type=int, default=None, help="Random seed, for a repeatable mix."
        )
        parser.add_argument(
            "--superuser",
            action="store_true",
            help="First create the superuser admin (password: admin) if it does not exist.",
        )

    def handle(
        self, *args: Any, quick: int, seed: int | None, superuser: bool, **options: Any
    ) -> None:
        if superuser:
            self._ensure_superuser()
        rng = random.Random(seed)  # noqa: S311 - demo data, not crypto
        now = timezone.now()
        enqueued = 0

        def report(label: str, result: Any) -> None:
            nonlocal enqueued
            enqueued += 1
            task = result.task
            run_after = task.run_after.isoformat(timespec="seconds") if task.run_after else "now"
            self.stdout.write(
                f"enqueued {label:<40} id={result.id} queue={task.queue_name} "
                f"priority={task.priority} run_after={run_after}"
            )

        for _ in range(quick):
            a, b = rng.randint(1, 100), rng.randint(1, 100)
            report(f"add({a}, {b})", add.enqueue(a, b))

        report(
            "add(1, 1) [high, priority 50]", add.using(queue_name="high", priority=50).enqueue(1, 1)
        )
        report(
            "add(2, 2) [low, priority -20]", add.using(queue_name="low", priority=-20).enqueue(2, 2)
        )

        for seconds in (5, 15, 30):
            report(
                f"slow({seconds}s, {seconds} steps)", slow.enqueue(seconds=seconds, steps=seconds)
            )
        report(
            "slow(10s) [in 1 minute]",
            slow.using(run_after=now + timedelta(minutes=1)).enqueue(seconds=10, steps=5),
        )
        report(
            "add(40, 2) [in 5 minutes, priority 10]",
            add.using(run_after=now + timedelta(minutes=5), priority=10).enqueue(40, 2),
        )

        report("flaky(succeed_on_attempt=2)", flaky.enqueue(succeed_on_attempt=2))
        report("flaky(succeed_on_attempt=3)", flaky.enqueue(succeed_on_attempt=3))
        report("flaky(succeed_on_attempt=9)", flaky.enqueue(succeed_on_attempt=9))
        report("always_fails()", always_fails.enqueue())
        for customer in (1, 2):
            for _ in range(3):
                report(
                    f"sync_customer({customer}) [one at a time]", sync_customer.enqueue(customer)
                )
        for number in range(8):
            report(f"notify({number}) [6 a minute]", notify.enqueue(number))
        report("crash_worker() [kills its worker; dead after 2 stalls]", crash_worker.enqueue())

        self.stdout.write(self.style.SUCCESS(f"{enqueued} demo jobs enqueued"))

    def _ensure_superuser(self) -> None:
        user_model = get_user_model()
        if user_model.objects.filter(username="admin").exists():
            self.stdout.write("superuser admin already exists")
        else:
            user_model.objects.create_superuser("admin", "admin@example.com", "admin")
            self.stdout.write("created superuser admin (password: admin)")
