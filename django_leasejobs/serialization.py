"""JSON-only storage of task arguments, results and checkpoints. Never pickle.

Values are checked up front, so a bad one raises :class:`InvalidTaskArguments` naming
its place (``args[1]``, ``kwargs['when'][3]``) before anything is stored. Besides
anything that is not a JSON value, these are refused, on every database alike:

* a string (value or object key) holding a NUL character (``"\\x00"``): PostgreSQL
  cannot store it in ``text`` or ``jsonb``;
* a string holding a lone surrogate (U+D800 to U+DFFF; in a Python ``str`` every
  surrogate code point is lone): it cannot be encoded as UTF-8;
* ``NaN`` and infinite floats, which JSON has no spelling for;
* an integer of more than :data:`MAX_INT_DIGITS` digits, which Python's JSON encoder
  and decoder refuse to convert by default;
* a circular reference, and lists and dicts nested deeper than :data:`MAX_DEPTH`.

They are refused rather than escaped: whatever is stored must reach the task (or
whoever reads the result) unchanged. What a job *reports* (error messages,
tracebacks) is escaped instead, see ``leases.storable_text``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .exceptions import InvalidTaskArguments

MAX_DEPTH = 100
"""Most lists and dicts nested inside each other in one argument, result or checkpoint."""

MAX_INT_DIGITS = 4300
"""Most decimal digits of an integer (Python's default ``sys.get_int_max_str_digits()``)."""

_INT_BOUND = 10**MAX_INT_DIGITS


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


def _to_json(value: Any, where: str, depth: int = 0) -> Any:
    """A checked JSON copy of ``value`` (at place ``where``), or InvalidTaskArguments."""
    try:
        return _convert(value, depth)
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
        raise InvalidTaskArguments(
            f"{_place(where, path)} is nested deeper than {MAX_DEPTH} levels of lists and "
            "dicts, which is refused; flatten the value, or store it elsewhere and pass "
            "its id."
        ) from None


def json_arguments(
    args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """Checked JSON copies of a task call's arguments, or :class:`InvalidTaskArguments`."""
    if not isinstance(args, list | tuple):
        raise InvalidTaskArguments(f"args must be a list or tuple, got {type(args).__name__}.")
    if not isinstance(kwargs, Mapping):
        raise InvalidTaskArguments(f"kwargs must be a dict, got {type(kwargs).__name__}.")
    # depth -1: ``args`` and ``kwargs`` themselves do not count towards MAX_DEPTH.
    return _to_json(list(args), "args", -1), _to_json(dict(kwargs), "kwargs", -1)


def json_value(value: Any, what: str = "value") -> Any:
    """A checked JSON copy of a result or checkpoint."""
    return _to_json(value, what)
