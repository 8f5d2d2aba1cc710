"""Alert rules (``OPTIONS["ALERTS"]``) evaluated by the workers, without a leader.

* ``values.py``: ``Alert``, the typed value the signals carry;
* ``measures.py``: what each kind measures, in bounded queries; its ``finished_counts``
  is the one place that counts finished jobs over a window;
* ``state.py``: the fenced writes, at most one alert per rule per interval across workers;
* ``evaluation.py``: one pass over a backend's rules (the worker's alert thread runs it);
* ``delivery.py``: the log record and the signal;
* ``banner.py``: the firing alerts the admin shows.

The rules themselves, parsed and checked, are ``alert_spec.py`` (``conf.py`` reads it).
"""

from .values import Alert

__all__ = ["Alert"]
