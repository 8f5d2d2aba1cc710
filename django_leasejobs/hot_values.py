"""``hot_value``: the decorator of the values a worker makes for every job.

A frozen dataclass sets each field in ``__init__`` through ``object.__setattr__``: for
``ClaimedJob`` (22 fields) that is about ten times the cost of a plain slotted dataclass
(4.6 against 0.5 µs on the machine of ``docs/benchmarks.md``'s cost model), paid in the
worker's main loop for every claimed job, and again for its hand-over, its outcome and
its write. A ``hot_value`` class is a plain slotted dataclass at run time, hashed and
compared by value as a frozen one is; type checkers see it frozen (PEP 681's
``frozen_default``), so an assignment to a field of one fails ``mypy``, as it would on a
frozen dataclass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar, dataclass_transform

T = TypeVar("T")


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def hot_value(cls: type[T]) -> type[T]:
    return dataclass(slots=True, unsafe_hash=True)(cls)
