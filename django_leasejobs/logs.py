"""Logging on the ``django_leasejobs`` logger: failure records that carry the attempt's
error, and the handler ``runworker`` installs when the project's ``LOGGING`` routes that
logger nowhere (docs/operations.md#logging)."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal

from .exceptions import TaskFailed

LOGGER_NAME = "django_leasejobs"

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"

LogFormat = Literal["text", "json"]

_RECORD_ATTRIBUTES = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
"""What every LogRecord has: the rest of a record's attributes are its ``extra`` keys."""


def log_failure(
    logger: logging.Logger,
    level: int,
    failure: TaskFailed,
    msg: str,
    *args: Any,
    extra: dict[str, Any],
) -> None:
    """Log ``msg`` with ``failure`` as the record's ``exc_info`` (what error trackers
    read) and the traceback recorded where the attempt ran as its ``exc_text`` (what
    ``logging.Formatter`` prints below the message)."""
    if not logger.isEnabledFor(level):
        return
    caller = sys._getframe(1)
    record = logger.makeRecord(
        logger.name,
        level,
        caller.f_code.co_filename,
        caller.f_lineno,
        msg,
        args,
        (type(failure), failure, None),
        caller.f_code.co_name,
        extra,
    )
    if failure.remote_traceback:
        record.exc_text = failure.remote_traceback.rstrip("\n")
    logger.handle(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ``time`` (ISO 8601, UTC), ``level``,
    ``logger``, ``message``, ``traceback`` when the record carries an exception, and
    the record's ``extra`` keys (values JSON cannot hold are written as text)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["traceback"] = record.exc_text
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRIBUTES:
                entry.setdefault(key, value)
        return json.dumps(entry, default=str)


def install_default_handler(level: int, log_format: LogFormat) -> None:
    """Send the ``django_leasejobs`` records to stderr, at ``level``, unless the project
    routes them already: a handler on that logger or on an ancestor it propagates to
    (``root`` included) means the project's ``LOGGING`` decides, and nothing changes.
    A level the project set on the logger (without a handler) is kept."""
    logger = logging.getLogger(LOGGER_NAME)
    if logger.hasHandlers():
        return
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    handler.setLevel(level)
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(level)
