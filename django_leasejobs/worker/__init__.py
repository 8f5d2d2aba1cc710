"""The worker runtime: main loop, heartbeat, pools of slots, child processes."""

from .lifecycle import wait_for_database
from .loop import Worker, WorkerConfig
from .supervisor import Supervisor

__all__ = ["Supervisor", "Worker", "WorkerConfig", "wait_for_database"]
