"""Slots that run jobs: long-lived child processes (default) or threads.

Both pools implement one interface (``Pool``): submit jobs to a slot, collect events
(outcomes, progress, starts, dead slots, jobs taken back), and stop a job. The process
pool can really stop a job (signals to its process group); the thread pool can only
flag it (``context.lease_lost``) and rely on the fence.
"""

from .events import (
    Event,
    Lease,
    Pool,
    ProgressEvent,
    Retracted,
    Room,
    SlotDied,
    Started,
    StopAction,
    describe_exit,
)
from .process import ProcessPool
from .thread import ThreadPool

__all__ = [
    "Event",
    "Lease",
    "Pool",
    "ProcessPool",
    "ProgressEvent",
    "Retracted",
    "Room",
    "SlotDied",
    "Started",
    "StopAction",
    "ThreadPool",
    "describe_exit",
]
