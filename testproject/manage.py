#!/usr/bin/env python
"""Command-line utility for the test/demo project.

Run it from anywhere, typically from the repository root::

    python testproject/manage.py migrate

It puts the repository root (for ``django_leasejobs`` and ``tests``) and this
directory (for the ``testproject`` and ``demo`` packages) on ``sys.path``, so
nothing needs to be installed for the imports to work.
"""

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent


def main() -> None:
    for path in (str(HERE), str(REPO_ROOT)):
        if path not in sys.path:
            sys.path.insert(0, path)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
