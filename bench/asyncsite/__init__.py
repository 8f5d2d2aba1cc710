"""The tasks of ``bench/async_jobs.py``: the same nap, ``async def`` and plain, for this
project (``tasks``) and for procrastinate (``peer``), each leaving one line in a run file
when it starts and one when it ends (``runs``)."""
