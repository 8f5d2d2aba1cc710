"""A URLconf that cannot be imported: a worker must start without it (runworker runs only
the system checks a worker needs; tests/commands/test_runworker_command.py)."""

raise RuntimeError("runworker imported the URLconf")
