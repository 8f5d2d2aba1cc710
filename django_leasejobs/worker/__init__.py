"""The worker runtime: main loop, heartbeat, pools of slots, child processes."""

from .loop import Worker, WorkerConfig
from .supervisor import Supervisor

__all__ = ["Supervisor", "Worker", "WorkerConfig"]
