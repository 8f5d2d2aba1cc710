"""procrastinate's side: an App on the database named by ``$ASYNC_BENCH_PROCRASTINATE_DSN``
(a libpq connection string), with its own defaults (``PsycopgConnector``: a psycopg pool of
its default size), and the same ``async def`` nap as ``tasks.nap_async``.

Its worker: ``python -m procrastinate --app asyncsite.peer.app worker --concurrency N``.
"""

from __future__ import annotations

import asyncio
import os

from procrastinate import App, PsycopgConnector

from .runs import mark

DSN_ENV = "ASYNC_BENCH_PROCRASTINATE_DSN"

app = App(connector=PsycopgConnector(conninfo=os.environ.get(DSN_ENV, "")))


@app.task(name="nap_async")
async def nap_async(n: int, seconds: float) -> None:
    mark("s", n)
    await asyncio.sleep(seconds)
    mark("e", n)
