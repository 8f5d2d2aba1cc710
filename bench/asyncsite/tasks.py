"""This project's bench tasks: a nap of ``seconds``, ``async def`` (on the slot's event
loop) and plain (alone in its slot)."""

from __future__ import annotations

import asyncio
import time

from django_leasejobs import task

from .runs import mark


@task
async def nap_async(n: int, seconds: float) -> None:
    mark("s", n)
    await asyncio.sleep(seconds)
    mark("e", n)


@task
def nap_sync(n: int, seconds: float) -> None:
    mark("s", n)
    time.sleep(seconds)
    mark("e", n)
