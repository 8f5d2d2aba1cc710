"""JSON-only storage of task arguments, results and checkpoints. Never pickle.

Values are checked up front, so a bad one raises :class:`InvalidTaskArguments` naming
its place (``args[1]``, ``kwargs['when'][3]``) before anything is stored. Besides
anything that is not a JSON value, these are refused, on every database alike (but
for the depth, where MySQL and MariaDB store fewer levels):

* a string (value or object key) holding a NUL character (``"\\x00"``): PostgreSQL
  cannot store it in ``text`` or ``jsonb``;
* a string holding a lone surrogate (U+D800 to U+DFFF; in a Python ``str`` every
  surrogate code point is lone): it cannot be encoded as UTF-8;
* ``NaN`` and infinite floats, which JSON has no spelling for;
* an integer of more than :data:`MAX_INT_DIGITS` digits, which Python's JSON encoder
  and decoder refuse to convert by default;
* a circular reference, and lists and dicts nested deeper than :data:`MAX_DEPTH`, or
  than the job's database can store (MariaDB, MySQL: see :func:`depth_limits`).

They are refused rather than escaped: whatever is stored must reach the task (or
whoever reads the result) unchanged. What a job *reports* (error messages,
tracebacks) is escaped instead, see ``leases.storable_text``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from django.core.signals import setting_changed
from django.db import connections

from .exceptions import InvalidTaskArguments

MAX_DEPTH = 100
"""Most lists and dicts nested inside each other in one argument, result or checkpoint
(fewer where the database cannot store that many: :func:`depth_limits`)."""

MARIADB_MAX_DOCUMENT_DEPTH = 31
"""Most lists and dicts nested in one JSON column value MariaDB stores: ``JSON_VALID``,
the CHECK on its JSON columns, refuses 32 (``JSON_DEPTH_LIMIT`` in its json_lib.h;
``SELECT JSON_VALID(CONCAT(REPEAT('[', 32), REPEAT(']', 32)))`` is 0 on 10.11, 1 with
31). Scalars and object keys do not count."""

MYSQL_MAX_DOCUMENT_DEPTH = 100
"""The same for MySQL 8 (``JSON_DOCUMENT_MAX_DEPTH``; deeper raises
``ER_JSON_DOCUMENT_TOO_DEEP``). Scalars and object keys do not count."""

MAX_INT_DIGITS = 4300
"""Most decimal digits of an integer (Python's default ``sys.get_int_max_str_digits()``)."""

_INT_BOUND = 10**MAX_INT_DIGITS


class DepthLimits(NamedTuple):
    """How deep values may nest for one database."""

    argument: int
    """Lists and dicts nested in one argument (``args[i]``, ``kwargs[name]``): one less
    than a column value, as the ``args`` list and the ``kwargs`` dict hold them."""
    value: int
    """Lists and dicts nested in one result or checkpoint (the column value itself)."""
    refused_by: str
    """The database that cannot store more ("MariaDB", "MySQL"), or "" where the limits
    are :data:`MAX_DEPTH`, ours."""


_OURS = DepthLimits(MAX_DEPTH, MAX_DEPTH, "")
_limits_by_alias: dict[str, DepthLimits] = {}


def depth_limits(using: str | None = None) -> DepthLimits:
    """The nesting limits for values stored in database ``using`` (ours when None).

    PostgreSQL and SQLite store deeper values than :data:`MAX_DEPTH`; MySQL and MariaDB
    refuse JSON column values nested deeper than their own limit. Looked up once per
    database alias (MariaDB or MySQL is asked of the server).
    """
    if using is None:
        return _OURS
    found = _limits_by_alias.get(using)
    if found is None:
        connection = connections[using]
        if connection.vendor != "mysql":
            found = _OURS
        else:
            mariadb = bool(getattr(connection, "mysql_is_mariadb", False))
            document = MARIADB_MAX_DOCUMENT_DEPTH if mariadb else MYSQL_MAX_DOCUMENT_DEPTH
            found = DepthLimits(
                min(MAX_DEPTH, document - 1),
                min(MAX_DEPTH, document),
                "MariaDB" if mariadb else "MySQL",
            )
        _limits_by_alias[using] = found
    return found


def _forget_limits(*, setting: str, **kwargs: Any) -> None:
    if setting == "DATABASES":
        _limits_by_alias.clear()


setting_changed.connect(_forget_limits)


class _Refused(Exception):
    """Carries why a value was refused up the recursion, which adds the path on the way."""

    def __init__(self, reason: str, *, too_deep: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.too_deep = too_deep
        self.path: list[str] = []  # innermost part first
        self.containers: list[int] = []  # ids of the containers on the path, innermost first


def string_problem(text: str) -> str:
    """Why ``text`` cannot be stored ('' when it can). Fast: C-level scans only."""
    if "\x00" in text:
        return (
            "contains a NUL character ('\\x00'), which PostgreSQL cannot store in text or "
            "jsonb; remove it, or encode binary data (base64, hex) first"
        )
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            return (
                f"contains a lone surrogate (U+{ord(text[exc.start]):04X}), which cannot be "
                "encoded as UTF-8; decode bytes with a proper error handler first"
            )
    return ""


def _too_deep(container: Any) -> _Refused:
    refused = _Refused("", too_deep=True)
    refused.containers.append(id(container))
    return refused


def _convert(value: Any, depth: int) -> Any:
    """A JSON copy of ``value``; ``depth`` is the number of containers around it."""
    kind = type(value)
    if kind is str:
        if "\x00" in value or not value.isascii():
            problem = string_problem(value)
            if problem:
                raise _Refused(problem + ".")
        return value
    if kind is int:
        if -_INT_BOUND < value < _INT_BOUND:
            return value
        raise _Refused(
            f"is an integer of more than {MAX_INT_DIGITS} digits, which JSON encoding and "
            "decoding refuse by default; store it as a string."
        )
    if value is None or kind is bool:
        return value
    if kind is float:
        if math.isfinite(value):
            return value
        raise _Refused(f"is {value!r}, which JSON cannot represent.")
    if kind is list or kind is tuple:
        if depth >= MAX_DEPTH:
            raise _too_deep(value)
        converted_list = []
        index = 0
        try:
            for index, item in enumerate(value):  # noqa: B007 - read by the except clause
                converted_list.append(_convert(item, depth + 1))
        except _Refused as exc:
            exc.path.append(f"[{index}]")
            exc.containers.append(id(value))
            raise
        return converted_list
    if kind is dict or isinstance(value, Mapping):
        if depth >= MAX_DEPTH:
            raise _too_deep(value)
        converted: dict[str, Any] = {}
        key: Any = None
        bad_key = False
        try:
            for key, item in value.items():
                if type(key) is not str:
                    if not isinstance(key, str):
                        bad_key = True
                        raise _Refused(
                            f"has a key {key!r} of type {type(key).__name__}; JSON object "
                            "keys must be strings."
                        )
                    key = str.__str__(key)
                if "\x00" in key or not key.isascii():
                    problem = string_problem(key)
                    if problem:
                        bad_key = True
                        raise _Refused(f"has a key {key!r} that {problem}.")
                converted[key] = _convert(item, depth + 1)
        except _Refused as exc:
            if not bad_key:
                exc.path.append(f"[{key!r}]")
            exc.containers.append(id(value))
            raise
        return converted
    # Subclasses of the JSON scalars (str and int enums, bool's siblings).
    if isinstance(value, str):
        return _convert(str.__str__(value), depth)
    if isinstance(value, int):
        _convert(int(value), depth)
        return value
    if isinstance(value, float):
        _convert(float(value), depth)
        return value
    if isinstance(value, list | tuple):
        return _convert(list(value), depth)
    name = f"{type(value).__module__}.{type(value).__qualname__}"
    raise _Refused(
        f"is a {name}, which is not JSON. Task arguments and results must be "
        "JSON values (None, bool, int, float, str, list, dict with str keys); pass ids, "
        "ISO-8601 strings or numbers instead of objects."
    )


def _place(where: str, path: list[str]) -> str:
    """``where`` plus ``path``, with the middle of a very long path left out."""
    if len(path) > 12:
        return f"{where}{''.join(path[:6])}...{''.join(path[-4:])}"
    return where + "".join(path)


def _to_json(
    value: Any, where: str, depth: int = 0, limit: int = MAX_DEPTH, refused_by: str = ""
) -> Any:
    """A checked JSON copy of ``value`` (at place ``where``), or InvalidTaskArguments.

    ``depth`` is the number of containers around ``value`` that count; at most
    ``limit`` lists and dicts may nest (``refused_by`` the database that sets it).
    """
    try:
        # _convert refuses at MAX_DEPTH: a lower limit starts it that much deeper.
        return _convert(value, depth + MAX_DEPTH - limit)
    except _Refused as exc:
        path = exc.path[::-1]
        if not exc.too_deep:
            raise InvalidTaskArguments(f"{_place(where, path)} {exc.reason}") from None
        # Too deep: a circular reference if a container on the path repeats.
        containers = exc.containers[::-1]  # outermost first; containers[i] is at path[:i]
        seen: dict[int, int] = {}
        for level, container in enumerate(containers):
            if container in seen:
                inner = _place(where, path[:level])
                outer = _place(where, path[: seen[container]])
                raise InvalidTaskArguments(
                    f"{inner} is {outer} itself (a circular reference), which JSON "
                    "cannot represent."
                ) from None
            seen[container] = level
        why = f"which {refused_by} cannot store" if refused_by else "which is refused"
        raise InvalidTaskArguments(
            f"{_place(where, path)} is nested deeper than {limit} levels of lists and "
            f"dicts, {why}; flatten the value, or store it elsewhere and pass its id."
        ) from None


def json_arguments(
    args: Sequence[Any], kwargs: Mapping[str, Any], *, using: str | None = None
) -> tuple[list[Any], dict[str, Any]]:
    """Checked JSON copies of a task call's arguments, or :class:`InvalidTaskArguments`.

    ``using``: the database alias the job is stored in, whose nesting limit applies.
    """
    if not isinstance(args, list | tuple):
        raise InvalidTaskArguments(f"args must be a list or tuple, got {type(args).__name__}.")
    if not isinstance(kwargs, Mapping):
        raise InvalidTaskArguments(f"kwargs must be a dict, got {type(kwargs).__name__}.")
    if not args and not kwargs:  # a call without arguments: nothing to check or copy
        return [], {}
    limit, _, refused_by = depth_limits(using)
    # depth -1: ``args`` and ``kwargs`` themselves do not count towards the limit.
    return (
        _to_json(list(args), "args", -1, limit, refused_by),
        _to_json(dict(kwargs), "kwargs", -1, limit, refused_by),
    )


def json_value(value: Any, what: str = "value", *, using: str | None = None) -> Any:
    """A checked JSON copy of a result or checkpoint (``using``: as for arguments)."""
    _, limit, refused_by = depth_limits(using)
    return _to_json(value, what, 0, limit, refused_by)
