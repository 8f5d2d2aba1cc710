"""Finding jobs by what they carry: the search syntax of the admin's job list.

A search is words separated by spaces; a job matches when it matches every word:

* ``kwargs.customer_id:4711`` or ``args.0:42``: the value at that path inside the job's
  arguments equals the value after the colon. Paths go down with dots: names for keys of
  objects, numbers for positions in arrays (``kwargs.order.lines.0.sku:A-1``). The value
  is read as JSON when it is JSON (``42``, ``true``, ``null``, ``"4711"`` quoted), else as
  text; a bare number also matches the same digits stored as text (``4711`` finds
  ``"4711"``), since a caller rarely knows which one was enqueued;
* ``#123`` or ``123``: the job with that id;
* any other word: a part of the task path, the error, or the worker, or the whole dedup
  key.

On a database whose JSON columns support containment (PostgreSQL, MySQL/MariaDB), an
argument path is also asked as a containment (``kwargs @> '{"customer_id": 4711}'``),
which PostgreSQL answers from the GIN indexes on ``args`` and ``kwargs`` (migration
0018; since 0022 they hold only the jobs that have some, and the query says it wants only
those); the exact path test then keeps only the jobs with the value at that very place.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from django.db import connections
from django.db.models import F, Q, QuerySet
from django.db.models.fields.json import KeyTransform

from .models import Job

_EMPTY: dict[str, list[Any] | dict[str, Any]] = {"args": [], "kwargs": {}}
"""What a job without positional or keyword arguments stores in the column."""
_PATH_TERM = re.compile(r"^(args|kwargs)((?:\.[^.:\s]+)+):(.*)$", re.DOTALL)
_ID_TERM = re.compile(r"^#?([0-9]{1,18})$")


class SearchSyntaxError(ValueError):
    """A search word that looks like an argument path but is not one (says why and how)."""


@dataclass(frozen=True, slots=True)
class ArgumentTerm:
    """``args.0:42``: the value at ``path`` inside ``field`` is one of ``values``."""

    field: str
    path: tuple[str | int, ...]
    values: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class JobSearch:
    """A parsed search: argument terms, job ids and free words (every one must match)."""

    arguments: tuple[ArgumentTerm, ...] = ()
    ids: tuple[int, ...] = ()
    words: tuple[str, ...] = ()

    @property
    def by_arguments(self) -> bool:
        return bool(self.arguments)


def parse_search(text: str) -> JobSearch:
    """The search ``text`` as a :class:`JobSearch`; :class:`SearchSyntaxError` for a word
    that starts like an argument path and is not one."""
    arguments: list[ArgumentTerm] = []
    ids: list[int] = []
    words: list[str] = []
    for word in text.split():
        if word.startswith(("args.", "kwargs.", "args:", "kwargs:")):
            arguments.append(_argument_term(word))
        elif match := _ID_TERM.match(word):
            ids.append(int(match.group(1)))
        else:
            words.append(word)
    return JobSearch(tuple(arguments), tuple(ids), tuple(words))


def _argument_term(word: str) -> ArgumentTerm:
    match = _PATH_TERM.match(word)
    if match is None:
        raise SearchSyntaxError(
            f"{word!r} is not an argument search: write a path and a value, "
            "kwargs.customer_id:4711 or args.0:42 (dots between the keys and positions)"
        )
    field, dotted, raw = match.groups()
    path: tuple[str | int, ...] = tuple(
        int(part) if part.isdecimal() else part for part in dotted[1:].split(".")
    )
    if field == "args" and not isinstance(path[0], int):
        raise SearchSyntaxError(
            f"{word!r}: args is a list, so its path starts with a position (args.0:42)"
        )
    if raw == "":
        raise SearchSyntaxError(f"{word!r} has no value after the colon (kwargs.key:value)")
    return ArgumentTerm(field, path, _values(raw))


def _values(raw: str) -> tuple[Any, ...]:
    """What a value written in a search matches: its JSON reading (else the text), and a
    bare number's digits as text too."""
    try:
        value = json.loads(raw)
    except ValueError:
        return (raw,)
    if isinstance(value, (dict, list)):
        return (raw,)  # a search matches scalars; the text is all it can mean
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return (value,)
    if isinstance(value, float) and not math.isfinite(value):
        return (raw,)  # NaN, Infinity, 1e400: no JSON number, only text
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        return (raw,)  # beyond what every database compares as a number
    return (value, raw)


def apply_search(queryset: QuerySet[Job], search: JobSearch) -> QuerySet[Job]:
    """``queryset`` narrowed to the jobs that match every term of ``search``."""
    using = queryset.db
    containment = connections[using].features.supports_json_field_contains
    for index, term in enumerate(search.arguments):
        # The path as key transforms, not a "__" lookup string: a key named like a lookup
        # ("contains", "in") or holding "__" stays a key.
        at: KeyTransform | F = F(term.field)
        for part in term.path:
            at = KeyTransform(str(part), at)
        name = f"_search_arg_{index}"
        queryset = queryset.alias(**{name: at})
        exact = Q()
        contained = Q()
        for value in term.values:
            exact |= Q(**{name: value})
            if containment:
                contained |= Q(**{f"{term.field}__contains": _nested(term.path, value)})
        if containment:
            # (Always true of a job the containment finds: it has some. Said for PostgreSQL,
            # whose GIN indexes leave out the jobs without any: migration 0022.)
            some = ~Q(**{term.field: _EMPTY[term.field]})
            queryset = queryset.filter(contained & some & exact)
        else:
            queryset = queryset.filter(exact)
    for job_id in search.ids:
        queryset = queryset.filter(pk=job_id)
    for word in search.words:
        queryset = queryset.filter(
            Q(task_path__icontains=word)
            | Q(last_error__icontains=word)
            | Q(last_worker__icontains=word)
            | Q(locked_by__icontains=word)
            | Q(key=word)
        )
    return queryset


def _nested(path: tuple[str | int, ...], value: Any) -> Any:
    """The smallest JSON that holds ``value`` at ``path`` (positions become one-item
    arrays: containment matches them at any position; the exact test keeps the place)."""
    for part in reversed(path):
        value = [value] if isinstance(part, int) else {part: value}
    return value
