"""WSGI entry point of the test/demo project."""

import os
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent.parent
for _path in (str(_HERE), str(_HERE.parent)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

from django.core.wsgi import get_wsgi_application  # noqa: E402

application = get_wsgi_application()
