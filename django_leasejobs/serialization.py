"""JSON-only storage of task arguments and results. Never pickle.

Values are checked up front so a bad argument raises a clear error naming its
place (``args[1]``, ``kwargs['when']``) before anything is stored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .exceptions import InvalidTaskArguments


def _to_json(value: Any, where: str) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidTaskArguments(f"{where} is {value!r}, which JSON cannot represent.")
        return value
    if isinstance(value, Mapping):
        converted = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidTaskArguments(
                    f"{where} has a key {key!r} of type {type(key).__name__}; "
                    "JSON object keys must be strings."
                )
            converted[key] = _to_json(item, f"{where}[{key!r}]")
        return converted
    if isinstance(value, list | tuple):
        return [_to_json(item, f"{where}[{i}]") for i, item in enumerate(value)]
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    raise InvalidTaskArguments(
        f"{where} is a {kind}, which is not JSON. Task arguments and results must be "
        "JSON values (None, bool, int, float, str, list, dict with str keys); pass ids, "
        "ISO-8601 strings or numbers instead of objects."
    )


def json_arguments(
    args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """Checked JSON copies of a task call's arguments, or :class:`InvalidTaskArguments`."""
    if not isinstance(args, list | tuple):
        raise InvalidTaskArguments(f"args must be a list or tuple, got {type(args).__name__}.")
    if not isinstance(kwargs, Mapping):
        raise InvalidTaskArguments(f"kwargs must be a dict, got {type(kwargs).__name__}.")
    return _to_json(list(args), "args"), _to_json(dict(kwargs), "kwargs")


def json_value(value: Any, what: str = "value") -> Any:
    """A checked JSON copy of a result or checkpoint."""
    return _to_json(value, what)
