"""The worker runtime: main loop, heartbeat, pools of slots, child processes."""

from .loop import Worker, WorkerConfig

__all__ = ["Worker", "WorkerConfig"]
